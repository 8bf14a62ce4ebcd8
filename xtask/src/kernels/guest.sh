#!/bin/busybox sh
# PID 1 of the test VM that `cargo xtask kernels` boots: builds a routed kind-style node
# (the VM's own network namespace; the VM has no network card), pod namespaces running
# busybox httpd, a client namespace, loads kube-proxy's rules (iptables, then nftables),
# runs `observer record` around known clients, and reports on /dev/ttyS1, one tagged line
# each, for the host to check. Nothing here decides pass or fail.
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/bin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu
mkdir -p /proc /sys /dev /run /tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /run/netns
# busybox's shell prefers its own applets to PATH: iproute2's ip (netns) by its path.
ip() { /usr/sbin/ip "$@"; }
exec 3>/dev/ttyS1
say() { echo "$*" >&3; }
. /scenario.env

say "RELEASE $(uname -r)"
for m in $(cat /modules/order); do
    insmod "/modules/$m" 2>/tmp/insmod.err || say "FAIL insmod $m: $(cat /tmp/insmod.err)"
done

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
for p in $PODS; do
    name=${p%%:*} ip=${p#*:}
    pod "$name" "$ip"
    mkdir -p "/www/$name" && echo "$name" > "/www/$name/index.html"
    ip netns exec "$name" httpd -p "$HTTP_PORT" -h "/www/$name"
done
pod client "$CLIENT_IP"

progs() { bpftool prog show 2>/dev/null | grep -c '^[0-9]*:'; }

# One scenario: observer records while the client opens $CONNS connections, each sending
# a request of its own size (so every record matches one client's observation).
scenario() { # name
    before=$(progs)
    : > "/tmp/$1.err"
    RUST_LOG=observer::kernel::capture=debug /observer record --write "/tmp/$1.jsonl" \
        2>"/tmp/$1.err" &
    pid=$!
    i=0
    # observer's own line, printed once every program is attached (a debug line before it
    # says "net_dev_queue attached" while the cgroup programs are still to come).
    while ! grep -q '^observer: attached' "/tmp/$1.err" && kill -0 $pid 2>/dev/null && [ $i -lt 1200 ]; do
        sleep 0.1; i=$((i + 1))
    done
    during=$(progs)
    for i in $(seq 1 "$CONNS"); do
        pad=$(head -c "$i" /dev/zero | tr '\0' x)
        printf 'GET / HTTP/1.0\r\nHost: %s\r\nX-Pad: %s\r\n\r\n' "$VIP" "$pad" > /tmp/req
        ip netns exec client timeout 20 nc "$VIP" "$VPORT" < /tmp/req > /tmp/resp
        say "CLIENT $1 $i $(wc -c < /tmp/req) $(wc -c < /tmp/resp) $(tail -n 1 /tmp/resp)"
    done
    sleep 1
    kill -INT $pid
    wait $pid
    say "EXIT $1 $?"
    while read -r line; do say "STDERR $1 $line"; done < "/tmp/$1.err"
    while read -r line; do say "LOG $1 $line"; done < "/tmp/$1.jsonl"
    say "PROGS $1 $before $during $(progs) $(ls /sys/fs/bpf | wc -l)"
}

iptables-restore --noflush < /rules/iptables-setup 2>/tmp/r.err || say "FAIL iptables-restore setup: $(cat /tmp/r.err)"
iptables-restore --noflush < /rules/iptables-sync 2>/tmp/r.err || say "FAIL iptables-restore sync: $(cat /tmp/r.err)"
scenario iptables
nft flush ruleset
nft -f /rules/nftables.nft 2>/tmp/r.err || say "FAIL nft -f: $(cat /tmp/r.err)"
scenario nftables

/observer record --btf /nonexistent --write /tmp/nobtf.jsonl 2>/tmp/nobtf.err
say "NOBTF $? $(cat /tmp/nobtf.err)"
say "DONE"
exec 3>&-
poweroff -f
