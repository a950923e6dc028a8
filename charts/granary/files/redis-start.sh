#!/bin/sh
# Starts one Redis data server of a Sentinel set as the primary or as a replica.
# The sentinels are asked, in order, which server is the primary; when none
# answers (the first start of the set, or every sentinel down) the first server
# (FIRST_PRIMARY) is. A server the answer names is the primary; every other
# server starts as its replica. The sentinels correct a wrong guess: they
# reconfigure any server they find replicating the wrong primary.
#
# Environment (set by the chart's StatefulSet; the chart's test sets its own):
#   BASE_CONF      redis.conf from the Secret (requirepass, masterauth, ...)
#   RUN_DIR        a writable directory for the final redis.conf (CONFIG REWRITE)
#   REDIS_PORT     the port this server listens on and announces
#   SELF_HOST      the name this server announces (its pod's stable name)
#   SELF_IP        this server's address, also taken as "me" (optional)
#   FIRST_PRIMARY  host:port of the first server
#   SENTINELS      host:port of each sentinel, separated by spaces
#   MASTER_NAME    the master name the sentinels monitor
set -eu
# The sentinels have no password: the data servers' one (REDISCLI_AUTH) is not sent to them.

conf="$RUN_DIR/redis.conf"
primary=""
for s in $SENTINELS; do
  answer=$(timeout 3 env -u REDISCLI_AUTH redis-cli -h "${s%:*}" -p "${s##*:}" \
    sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null) || continue
  host=$(printf '%s\n' "$answer" | sed -n 1p)
  port=$(printf '%s\n' "$answer" | sed -n 2p)
  if [ -n "$host" ] && [ -n "$port" ]; then
    primary="$host:$port"
    echo "redis-start: sentinel $s names $primary as the primary of $MASTER_NAME"
    break
  fi
done
if [ -z "$primary" ]; then
  primary="$FIRST_PRIMARY"
  echo "redis-start: no sentinel named a primary of $MASTER_NAME; the first server, $primary, is"
fi

umask 077
# Not cp: it would keep the Secret file's mode (0440, so 0400 here), and the
# append below would be refused to the redis user, which owns it but may not write.
cat "$BASE_CONF" >"$conf"
{
  echo  # the Secret's redis.conf does not end with a newline
  echo "port $REDIS_PORT"
  echo "replica-announce-ip $SELF_HOST"
  echo "replica-announce-port $REDIS_PORT"
} >>"$conf"
case "$primary" in
  "$SELF_HOST:$REDIS_PORT" | "${SELF_IP:-none}:$REDIS_PORT")
    echo "redis-start: starting $SELF_HOST as the primary" ;;
  *)
    echo "replicaof ${primary%:*} ${primary##*:}" >>"$conf"
    echo "redis-start: starting $SELF_HOST as a replica of $primary" ;;
esac
exec redis-server "$conf"
