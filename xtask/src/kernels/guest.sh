#!/bin/busybox sh
# PID 1 of the test VM that `cargo xtask kernels` boots: builds a routed kind-style node
# (the VM's own network namespace; the VM has no network card), pod namespaces running
# busybox httpd and a line server that keeps connections open, a client namespace, loads
# kube-proxy's rules (iptables, then nftables), runs `observer record` around known
# clients (one connection opened before observer starts), and reports on the console,
# one tagged line each after a mark, for the host to check. Nothing here decides pass or
# fail.
/bin/busybox --install -s /bin
. /scenario.env
export PATH=/usr/sbin:/bin LD_LIBRARY_PATH="$LIBRARY_PATH"
mkdir -p /proc /sys /dev /run /tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /run/netns
# The board may have one serial port, shared with the kernel's console: from here on
# only kernel errors (a stall, an oops) interrupt the report.
dmesg -n 4
# busybox's shell prefers its own applets to PATH: iproute2's ip (netns) by its path.
ip() { /usr/sbin/ip "$@"; }
exec 3>/dev/console
say() { echo "@@ $*" >&3; }

say "RELEASE $(uname -r)"
load() { # module group
    for m in $(cat "/modules/$1"); do
        insmod "/modules/$m" 2>/tmp/insmod.err || say "FAIL insmod $m: $(cat /tmp/insmod.err)"
    done
}
load netfilter

progs() { bpftool prog show 2>/dev/null | grep -c '^[0-9]*:'; }
# Whether process $1 runs (an exited child stays a zombie until waited for).
alive() {
    case $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) in '' | Z) return 1 ;; esac
}

# Starts `observer record` for scenario $1 and waits for observer's own line, printed
# once every program is attached (a debug line before it says "net_dev_queue attached"
# while the cgroup programs are still to come). Without the held connection's writer
# (fd 4): its client must see the end of its input when the script closes it.
start_observer() { # name
    : > "/tmp/$1.err"
    RUST_LOG=observer::kernel=debug /observer record --write "/tmp/$1.jsonl" \
        2>"/tmp/$1.err" 4>&- &
    pid=$!
    i=0
    while ! grep -q '^observer: attached' "/tmp/$1.err" && alive $pid && [ $i -lt 1200 ]; do
        sleep 0.1; i=$((i + 1))
    done
}

stop_observer() { # name
    kill -INT $pid
    i=0
    while alive $pid && [ $i -lt 600 ]; do
        sleep 0.1; i=$((i + 1))
    done
    if alive $pid; then
        say "FAIL $1: observer did not exit within 60 s of SIGINT"
        kill -KILL $pid
    fi
    wait $pid
    say "EXIT $1 $?"
    while read -r line; do say "STDERR $1 $line"; done < "/tmp/$1.err"
}

# Without conntrack's netlink interface observer still records, and says what it lacks.
start_observer without-ctnetlink
stop_observer without-ctnetlink
load ctnetlink

# The node: forwarding on, one veth per pod (routed: 10.244.1.1/32 on every node-side veth).
ip link set lo up
echo 1 > /proc/sys/net/ipv4/ip_forward
pod() { # name ip [server-dir]
    ip netns add "$1"
    ip link add "v-$1" type veth peer name eth0 netns "$1"
    ip addr add "$NODE_IP/32" dev "v-$1"
    ip link set "v-$1" up
    ip route add "$2/32" dev "v-$1"
    ip -n "$1" link set lo up
    ip -n "$1" addr add "$2/32" dev eth0
    ip -n "$1" link set eth0 up
    ip -n "$1" route add "$NODE_IP/32" dev eth0
    ip -n "$1" route add default via "$NODE_IP" dev eth0
}
# The line server: answers each line of a connection with the pod's name and the line,
# until the client closes it.
printf '#!/bin/busybox sh\nwhile IFS= read -r line; do echo "$POD $line"; done\n' > /serve-lines
chmod +x /serve-lines
for p in $PODS; do
    name=${p%%:*} ip=${p#*:}
    pod "$name" "$ip"
    mkdir -p "/www/$name" && echo "$name" > "/www/$name/index.html"
    ip netns exec "$name" httpd -p "$HTTP_PORT" -h "/www/$name"
    ip netns exec "$name" env POD="$name" nc -ll -p "$LINES_PORT" -e /serve-lines &
done
pod client "$CLIENT_IP"

# A connection through the line port, opened (and used) before observer starts.
held_open() {
    rm -f /tmp/held.in /tmp/held.out
    mkfifo /tmp/held.in
    ip netns exec client timeout 60 nc "$VIP" "$LINES_VPORT" < /tmp/held.in > /tmp/held.out &
    held=$!
    exec 4>/tmp/held.in
    held_line "before observer"
}
# Sends one line on it and waits for its answer.
held_line() { # text
    want=$(($(wc -l < /tmp/held.out) + 1))
    echo "$1" >&4
    i=0
    while [ "$(wc -l < /tmp/held.out)" -lt $want ] && [ $i -lt 200 ]; do
        sleep 0.1; i=$((i + 1))
    done
}
# Its lines after observer attached, then its close; reports what the client sent and
# received meanwhile, the lines answered and the pod that answered.
held_use() { # scenario
    received_before=$(wc -c < /tmp/held.out)
    lines_before=$(wc -l < /tmp/held.out)
    sent=0
    for i in $(seq 1 "$HELD_LINES"); do
        line="after $(head -c $((i * 7)) /dev/zero | tr '\0' y)"
        held_line "$line"
        sent=$((sent + ${#line} + 1))
    done
    exec 4>&-
    wait $held
    pods=$(tail -n +$((lines_before + 1)) /tmp/held.out | cut -d' ' -f1 | sort -u | tr '\n' ' ')
    say "HELD $1 $sent $(($(wc -c < /tmp/held.out) - received_before)) $(($(wc -l < /tmp/held.out) - lines_before)) ${pods% }"
}

# One scenario: a connection opened before observer, then observer records while that
# connection carries more lines and the client opens $CONNS connections, each sending a
# request of its own size (so every record matches one client's observation).
scenario() { # name
    held_open
    before=$(progs)
    start_observer "$1"
    during=$(progs)
    held_use "$1"
    for i in $(seq 1 "$CONNS"); do
        pad=$(head -c "$i" /dev/zero | tr '\0' x)
        printf 'GET / HTTP/1.0\r\nHost: %s\r\nX-Pad: %s\r\n\r\n' "$VIP" "$pad" > /tmp/req
        ip netns exec client timeout 20 nc "$VIP" "$VPORT" < /tmp/req > /tmp/resp
        say "CLIENT $1 $i $(wc -c < /tmp/req) $(wc -c < /tmp/resp) $(tail -n 1 /tmp/resp)"
    done
    sleep 1
    stop_observer "$1"
    while read -r line; do say "LOG $1 $line"; done < "/tmp/$1.jsonl"
    say "PROGS $1 $before $during $(progs) $(ls /sys/fs/bpf | wc -l)"
}

iptables-restore --noflush < /rules/iptables-setup 2>/tmp/r.err || say "FAIL iptables-restore setup: $(cat /tmp/r.err)"
iptables-restore --noflush < /rules/iptables-sync 2>/tmp/r.err || say "FAIL iptables-restore sync: $(cat /tmp/r.err)"
scenario iptables
nft flush ruleset
nft -f /rules/nftables.nft 2>/tmp/r.err || say "FAIL nft -f: $(cat /tmp/r.err)"
scenario nftables

# A flowtable on the node, declared and offloading nothing: observer names it in one
# warning under either hook (read where the netfilter program links, or, on
# net_dev_queue, in each namespace a connection is in), while a connection stays open
# across its sweeps.
nft add table inet fast 2>/tmp/r.err || say "FAIL nft add table: $(cat /tmp/r.err)"
nft add flowtable inet fast ft '{ hook ingress priority 0; devices = { v-client }; }' \
    2>/tmp/r.err || say "FAIL nft add flowtable: $(cat /tmp/r.err)"
held_open
start_observer flowtable
held_line "while observer runs"
sleep 3
exec 4>&-
wait $held
stop_observer flowtable

/observer record --btf /nonexistent --write /tmp/nobtf.jsonl 2>/tmp/nobtf.err
say "NOBTF $? $(cat /tmp/nobtf.err)"
say "DONE"
exec 3>&-
poweroff -f
