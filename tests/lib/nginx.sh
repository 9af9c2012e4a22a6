# A real WebDAV server for the tests and benchmarks that copy files over HTTP
# PUT: Debian's nginx with its own configuration, in the foreground, on a free
# loopback port, stopped on exit. Source after lib.sh or bench.sh.
#
#   nginx_dav DIR [USER:PASSWORD]   serves DIR/dav (created) on 127.0.0.1:$NGINX_PORT,
#                                   with basic auth when a user is given; returns 1
#                                   (saying why on stderr) when it does not start
#   $NGINX                          the nginx binary ("" when not installed)
#   $NGINX_PID                      its master's pid, once nginx_dav started it

NGINX=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true)

nginx_dav() {
    _ng=$1
    mkdir -p "$_ng/dav" "$_ng/tmp"
    NGINX_PORT=$(free_port)
    _auth=""
    if [ -n "${2:-}" ]; then
        printf '%s:{PLAIN}%s\n' "${2%%:*}" "${2#*:}" >"$_ng/htpasswd"
        _auth="auth_basic \"mg\"; auth_basic_user_file $_ng/htpasswd;"
    fi
    {
        [ "$(id -u)" -eq 0 ] && echo "user root;"
        cat <<NGINX_EOF
daemon off;
worker_processes 1;
pid $_ng/nginx.pid;
error_log $_ng/error.log;
events { worker_connections 64; }
http {
    access_log $_ng/access.log;
    client_body_temp_path $_ng/tmp/body;
    proxy_temp_path $_ng/tmp/proxy;
    fastcgi_temp_path $_ng/tmp/fastcgi;
    uwsgi_temp_path $_ng/tmp/uwsgi;
    scgi_temp_path $_ng/tmp/scgi;
    server {
        listen 127.0.0.1:$NGINX_PORT;
        root $_ng/dav;
        client_max_body_size 0;
        location / {
            dav_methods PUT DELETE MKCOL;
            create_full_put_path on;
            $_auth
        }
    }
}
NGINX_EOF
    } >"$_ng/nginx.conf"
    # not bg: its cleanup SIGKILLs the master, which would leave the worker behind
    "$NGINX" -c "$_ng/nginx.conf" -p "$_ng" >"$_ng/stdout" 2>&1 &
    NGINX_PID=$!
    at_cleanup "kill -TERM $NGINX_PID 2>/dev/null; wait $NGINX_PID 2>/dev/null"
    wait_for 10 curl -s -o /dev/null "http://127.0.0.1:$NGINX_PORT/" && return 0
    echo "nginx did not start: $(cat "$_ng/error.log" "$_ng/stdout" 2>/dev/null | tail -n 3)" >&2
    return 1
}
