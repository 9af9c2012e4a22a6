# Bash completion for train: the options come from `train --help` itself, and
# the values of those that take one of a fixed set are completed (models,
# datasets, optimizers, schedules, devices), directories and files where the
# option names one. Installed by `make install` as
# $(PREFIX)/share/bash-completion/completions/train.

_train() {
    local cur=$2 prev=$3
    COMPREPLY=()
    case $prev in
    --model) COMPREPLY=($(compgen -W "mlp cnn" -- "$cur")); return ;;
    --data) COMPREPLY=($(compgen -W "fashion-mnist mnist synthetic" -- "$cur")); return ;;
    --optimizer) COMPREPLY=($(compgen -W "sgd adamw" -- "$cur")); return ;;
    --schedule) COMPREPLY=($(compgen -W "constant step cosine" -- "$cur")); return ;;
    --device) COMPREPLY=($(compgen -W "cpu cuda" -- "$cur")); return ;;
    --scale-lr) COMPREPLY=($(compgen -W "linear none" -- "$cur")); return ;;
    --data-dir | --checkpoint-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --metrics) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --resume) COMPREPLY=($(compgen -W "auto" -- "$cur") $(compgen -f -- "$cur")); return ;;
    --hidden | --dropout | --train-samples | --test-samples | --epochs | --steps | --batch-size | \
        --accum-steps | --lr | --momentum | --weight-decay | --betas | --eps | --warmup | \
        --step-size | --gamma | --min-lr | --seed | --threads | --eval-every | --log-every | \
        --checkpoint-every | --keep-checkpoints | --global-batch-size | --check-replicas | \
        --bucket-cap-mb)
        return
        ;;
    esac
    if [ -z "${_mg_opts_train-}" ]; then
        _mg_opts_train=$("${COMP_WORDS[0]}" --help 2>&1 | grep -oE -- '(^|[ ,])--[a-z][a-z-]*' |
            sed 's/^[ ,]*//' | sort -u | tr '\n' ' ')
    fi
    COMPREPLY=($(compgen -W "$_mg_opts_train" -- "$cur"))
}
complete -F _train train
