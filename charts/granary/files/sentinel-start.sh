#!/bin/sh
# Starts one sentinel of the chart's Sentinel set. Its configuration is written
# afresh on every start (the sentinel rewrites it as it learns; RUN_DIR is an
# emptyDir): the primary it monitors is the one the other sentinels name, or,
# when none answers, the first data server. The replicas and the other
# sentinels it learns from the primary.
#
# Environment (set by the chart's StatefulSet; the chart's test sets its own):
#   RUN_DIR               a writable directory for sentinel.conf
#   SENTINEL_PORT         the port this sentinel listens on and announces
#   SENTINEL_BIND         the addresses it listens on
#   SELF_HOST             the name this sentinel announces (its pod's stable name)
#   SENTINELS             host:port of each sentinel (this one included), spaces between
#   FIRST_PRIMARY         host:port of the first data server
#   MASTER_NAME, QUORUM, DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, PARALLEL_SYNCS
#   PASSWORD_FILE         the data servers' password (auth-pass)
#   RESOLVE_WAIT_SECONDS  how long to wait for the primary's name to resolve
set -eu
# The sentinels have no password: the data servers' one (REDISCLI_AUTH) is not sent to them.

conf="$RUN_DIR/sentinel.conf"
primary=""
for s in $SENTINELS; do
  [ "$s" = "$SELF_HOST:$SENTINEL_PORT" ] && continue
  answer=$(timeout 3 env -u REDISCLI_AUTH redis-cli -h "${s%:*}" -p "${s##*:}" \
    sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null) || continue
  host=$(printf '%s\n' "$answer" | sed -n 1p)
  port=$(printf '%s\n' "$answer" | sed -n 2p)
  if [ -n "$host" ] && [ -n "$port" ]; then
    primary="$host:$port"
    echo "sentinel-start: sentinel $s names $primary as the primary of $MASTER_NAME"
    break
  fi
done
if [ -z "$primary" ]; then
  primary="$FIRST_PRIMARY"
  echo "sentinel-start: no other sentinel named a primary of $MASTER_NAME; monitoring the first server, $primary"
fi

# A sentinel refuses a `sentinel monitor` whose host does not resolve: the
# primary's pod may have been created a moment ago, so wait for its name.
waited=0
until getent hosts "${primary%:*}" >/dev/null 2>&1; do
  if [ "$waited" -ge "${RESOLVE_WAIT_SECONDS:-120}" ]; then
    echo "sentinel-start: ${primary%:*} does not resolve after ${waited}s; is the Redis StatefulSet running?" >&2
    exit 1
  fi
  sleep 2
  waited=$((waited + 2))
done

umask 077
password=$(head -n 1 "$PASSWORD_FILE")
cat >"$conf" <<CONF
port $SENTINEL_PORT
bind $SENTINEL_BIND
protected-mode no
dir $RUN_DIR
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $SELF_HOST
sentinel announce-port $SENTINEL_PORT
sentinel monitor $MASTER_NAME ${primary%:*} ${primary##*:} $QUORUM
sentinel auth-pass $MASTER_NAME $password
sentinel down-after-milliseconds $MASTER_NAME $DOWN_AFTER_MS
sentinel failover-timeout $MASTER_NAME $FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $MASTER_NAME $PARALLEL_SYNCS
CONF
exec redis-server "$conf" --sentinel
