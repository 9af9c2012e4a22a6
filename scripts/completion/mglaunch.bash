# Bash completion for mglaunch (and `mglaunch logs`): the options come from
# `mglaunch --help` itself, so the list never drifts from the binary; the
# values of the options that have a fixed set are completed, and `--run` of
# `mglaunch logs` offers the run ids found in its LOG_DIR. After PROGRAM, the
# program's own completion takes over (bash-completion's _command_offset),
# else file names. Installed by `make install` as
# $(PREFIX)/share/bash-completion/completions/mglaunch.

# The long options in a program's --help text, once per shell.
_mg_options_of() {
    local var=_mg_opts_$1
    if [ -z "${!var-}" ]; then
        printf -v "$var" '%s' "$("$2" --help 2>&1 | grep -oE -- '(^|[ ,])--[a-zA-Z][a-zA-Z_-]*' |
            sed 's/^[ ,]*//' | sort -u | tr '\n' ' ')"
    fi
    printf '%s' "${!var}"
}

# The run ids in a log directory: the directories that hold an event log
# (mglaunch's) or attempt directories (mglaunch's or torchrun's).
_mg_run_ids() {
    local d=$1 r
    for r in "$d"/*/; do
        r=${r%/}
        [ -e "$r/events.jsonl" ] || compgen -G "$r/attempt_[0-9]*" >/dev/null || continue
        printf '%s\n' "${r##*/}"
    done
}

_mglaunch_logs() {
    local cur=$1 prev=$2 i dir=
    # LOG_DIR: the first word after `logs` that is not an option or its value
    # and is a directory (else it is a PROGRAM, in the default directory)
    for ((i = 2; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
        --run | --attempt | --rank | --stream | --tail | -n | --grep | --cmd | --plot) ((i++)) ;;
        -*) ;;
        *) [ -z "$dir" ] && [ -d "${COMP_WORDS[i]}" ] && dir=${COMP_WORDS[i]} ;;
        esac
    done
    [ -n "$dir" ] || dir=${TMPDIR:-/tmp}/mglaunch-$(id -u)
    case $prev in
    --run) COMPREPLY=($(compgen -W "$(_mg_run_ids "$dir")" -- "$cur")); return ;;
    --attempt)
        COMPREPLY=($(compgen -W "last all" -- "$cur"))
        return
        ;;
    --stream) COMPREPLY=($(compgen -W "stdout stderr both" -- "$cur")); return ;;
    --rank | --tail | -n | --grep | --cmd) return ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "--run --attempt --rank --stream --tail --follow --grep --cmd --plot --schedule --help" -- "$cur"))
    else
        COMPREPLY=($(compgen -d -- "$cur"))
    fi
}

_mglaunch() {
    local cur=$2 prev=$3 i w
    COMPREPLY=()
    if [ "${COMP_WORDS[1]-}" = logs ] && [ "$COMP_CWORD" -ge 2 ]; then
        _mglaunch_logs "$cur" "$prev"
        return
    fi
    # Where PROGRAM is: the first word that is neither an option nor the value
    # of one (an option written --opt=value carries its own).
    local opts flags
    opts=$(_mg_options_of mglaunch "${COMP_WORDS[0]}")
    flags=" --standalone --module -m --no_python --no-python --run_path --run-path \
--virtual-local-rank --virtual_local_rank --help -h --version -V "
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if [ "$w" = -- ]; then
            ((i++))
            break
        fi
        case $w in
        --*=*) continue ;;
        -*) [[ $flags == *" $w "* ]] || ((i++)) ;;
        *) break ;;
        esac
    done
    if [ "$i" -lt "$COMP_CWORD" ]; then
        if declare -F _command_offset >/dev/null; then
            _command_offset "$i"
        else
            COMPREPLY=($(compgen -f -- "$cur"))
        fi
        return
    fi
    case $prev in
    --nproc_per_node | --nproc-per-node)
        COMPREPLY=($(compgen -W "auto cpu gpu xpu 1 2 4 8" -- "$cur")); return ;;
    --rdzv_backend | --rdzv-backend) COMPREPLY=($(compgen -W "static c10d etcd" -- "$cur")); return ;;
    --start_method | --start-method) COMPREPLY=($(compgen -W "spawn fork forkserver" -- "$cur")); return ;;
    --numa-binding | --numa_binding)
        COMPREPLY=($(compgen -W "node socket exclusive core-complex" -- "$cur")); return ;;
    --redirects | -r | --tee | -t) COMPREPLY=($(compgen -W "0 1 2 3" -- "$cur")); return ;;
    --signals-to-handle | --signals_to_handle)
        COMPREPLY=($(compgen -W "SIGTERM,SIGINT,SIGHUP,SIGQUIT SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2" -- "$cur"))
        return
        ;;
    --log_dir | --log-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --nnodes | --node_rank | --node-rank | --rdzv_id | --rdzv-id | --rdzv_endpoint | --rdzv-endpoint | \
        --rdzv_conf | --rdzv-conf | --max_restarts | --max-restarts | --monitor_interval | \
        --monitor-interval | --role | --local_ranks_filter | --local-ranks-filter | \
        --log_line_prefix_template | --master_addr | --master-addr | --master_port | --master-port | \
        --local_addr | --local-addr | --gpu_ids | --gpu-ids | --shutdown_timeout | --shutdown-timeout | --stop_group_delay | --stop-group-delay | \
        --hang-timeout | --hang_timeout | \
        --exit_barrier_timeout | --exit-barrier-timeout | \
        --event-log-handler | --duplicate-stdout-filters | --duplicate-stderr-filters | --logs_specs)
        return
        ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "logs dump" -- "$cur") $(compgen -c -- "$cur") $(compgen -f -- "$cur"))
    else
        COMPREPLY=($(compgen -c -- "$cur") $(compgen -f -- "$cur"))
    fi
}
complete -F _mglaunch mglaunch
