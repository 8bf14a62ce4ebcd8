#!/usr/bin/env python3
"""Rewrites kube-proxy's own nftables test dump (k8s-overall.nft, kubernetes
TestOverallNFTablesRules, the layout up to 1.35) into the layouts kube-proxy wrote since:

- 1.36 (kubernetes commit 475f9622c8): endpoint chains squashed into the Service chain,
  `meta l4proto tcp dnat ip addr . port to numgen random mod N map { i : IP . port }`;
  endpoint chains stay only for ClientIP affinity (`update @affinity-...`). The
  mark-for-masquerade chain went too (commit 5cffb4d1f6): its jumps become the mark
  it set, in place (observer follows DNAT; masquerade marks change nothing it reads).
- 1.37 (kubernetes PR 140723): a one-endpoint Service chain does `meta l4proto tcp dnat to
  IP:port` itself.
- dispatch (proposed for 1.38, kubernetes PR 140362 / issue 139513): ClusterIPs go to shared
  `dispatch-N` chains, `ct mark set numgen random mod N dnat ip addr . port to ip daddr .
  meta l4proto . th dport . ct mark map @endpoints`, one `@endpoints` map for all Services.
  `named` keeps a comment naming the Service port on its service-ips element; `unnamed`
  does not (the design names the Service nowhere).

Usage: layouts.py k8s-overall.nft OUT_DIR  (writes k8s-overall-<layout>.nft)
"""
import re
import sys

MASQ = "meta mark set meta mark or 0x4000"


def squash(lines, single_dnat):
    # Endpoint chains: chain -> (ip, port); those with affinity stay.
    dnat = {}
    affinity = set()
    for line in lines:
        m = re.match(r"add rule ip kube-proxy (endpoint-\S+) meta l4proto (\w+) dnat to ([\d.]+):(\d+)", line)
        if m:
            dnat[m.group(1)] = (m.group(2), m.group(3), m.group(4))
        m = re.match(r"add rule ip kube-proxy (endpoint-\S+) update @", line)
        if m:
            affinity.add(m.group(1))
    out = []
    for line in lines:
        if line == "add chain ip kube-proxy mark-for-masquerade" or line.startswith(
            "add rule ip kube-proxy mark-for-masquerade "
        ):
            continue
        line = line.replace("jump mark-for-masquerade", MASQ)
        m = re.match(r"add (chain|rule) ip kube-proxy (endpoint-\S+)", line)
        if m and m.group(2) not in affinity:
            continue
        m = re.match(r"(add rule ip kube-proxy \S+) numgen random mod (\d+) vmap \{ (.*) \}$", line)
        if m:
            targets = re.findall(r"(\d+) : goto (\S+)", m.group(3))
            proto = dnat[targets[0][1]][0]
            if single_dnat and len(targets) == 1:
                _, ip, port = dnat[targets[0][1]]
                line = f"{m.group(1)} meta l4proto {proto} dnat to {ip}:{port}"
            else:
                elements = " , ".join(f"{i} : {dnat[c][1]} . {dnat[c][2]}" for i, c in targets)
                line = (
                    f"{m.group(1)} meta l4proto {proto} dnat ip addr . port to "
                    f"numgen random mod {m.group(2)} map {{ {elements} }}"
                )
        out.append(line)
    return out


def dispatch(lines, named):
    """ClusterIPs of Services without affinity through dispatch-N and @endpoints."""
    endpoints = {}  # service chain -> [(ip, port)]
    affinity_chains = set()
    for line in lines:
        m = re.match(r"add rule ip kube-proxy (service-\S+) meta l4proto \w+ dnat to ([\d.]+):(\d+)$", line)
        if m:
            endpoints[m.group(1)] = [(m.group(2), m.group(3))]
        m = re.match(r"add rule ip kube-proxy (service-\S+) meta l4proto \w+ dnat ip addr \. port to numgen random mod \d+ map \{ (.*) \}$", line)
        if m:
            endpoints[m.group(1)] = re.findall(r"\d+ : ([\d.]+) \. (\d+)", m.group(2))
        m = re.match(r"add rule ip kube-proxy (service-\S+) ip saddr @affinity", line)
        if m:
            affinity_chains.add(m.group(1))
    out = []
    counts = set()
    for line in lines:
        m = re.match(r"add element ip kube-proxy service-ips \{ ([\d.]+) \. (\w+) \. (\d+) : goto (service-\S+) \}$", line)
        if m and m.group(4) in endpoints and m.group(4) not in affinity_chains:
            ip, proto, port, chain = m.groups()
            eps = endpoints[chain]
            counts.add(len(eps))
            name = re.match(r"service-\w+-([^/]+)/([^/]+)/\w+/(\S+)", chain).groups()
            comment = f' comment "{name[0]}/{name[1]}:{name[2]}"' if named else ""
            out.append(f"add element ip kube-proxy service-ips {{ {ip} . {proto} . {port}{comment} : goto dispatch-{len(eps)} }}")
            for i, (eip, eport) in enumerate(eps):
                out.append(f"add element ip kube-proxy endpoints {{ {ip} . {proto} . {port} . {i} : {eip} . {eport} }}")
            continue
        out.append(line)
    head = [
        "add map ip kube-proxy endpoints { type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service ; }"
    ]
    for n in sorted(counts):
        head.append(f"add chain ip kube-proxy dispatch-{n}")
        head.append(
            f"add rule ip kube-proxy dispatch-{n} ct mark set numgen random mod {n} "
            "dnat ip addr . port to ip daddr . meta l4proto . th dport . ct mark map @endpoints"
        )
    # After the table's own maps are declared.
    at = max(i for i, l in enumerate(out) if l.startswith("add map ")) + 1
    return out[:at] + head + out[at:]


def main():
    source, out_dir = sys.argv[1], sys.argv[2]
    lines = open(source).read().splitlines()
    layouts = {
        "1.36": squash(lines, single_dnat=False),
        "1.37": squash(lines, single_dnat=True),
    }
    layouts["dispatch-named"] = dispatch(layouts["1.37"], named=True)
    layouts["dispatch-unnamed"] = dispatch(layouts["1.37"], named=False)
    for name, text in layouts.items():
        with open(f"{out_dir}/k8s-overall-{name}.nft", "w") as f:
            f.write("\n".join(text) + "\n")


main()
