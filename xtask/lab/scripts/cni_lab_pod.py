#!/usr/bin/python3
"""A CNI plugin for the lab's private containerd. containerd's CRI plugin needs a pod
network that returns the pod's address; the lab wires the pod's namespace itself (veth,
address, route) once the sandbox exists, so this plugin only reports the address the lab
will give the pod, read from `<ipsDir>/<pod name>` (K8S_POD_NAME in CNI_ARGS). It adds
nothing to any namespace."""

import json
import os
import sys

config = json.load(sys.stdin)
command = os.environ.get("CNI_COMMAND")
if command == "ADD":
    args = dict(
        pair.split("=", 1) for pair in os.environ.get("CNI_ARGS", "").split(";") if "=" in pair
    )
    with open(os.path.join(config["ipsDir"], args["K8S_POD_NAME"])) as f:
        address = f.read().strip()
    json.dump({
        "cniVersion": config["cniVersion"],
        "interfaces": [{"name": os.environ["CNI_IFNAME"], "sandbox": os.environ["CNI_NETNS"]}],
        "ips": [{"version": "4", "address": address, "interface": 0}],
    }, sys.stdout)
elif command == "VERSION":
    json.dump({"cniVersion": "0.4.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0"]}, sys.stdout)
# DEL and CHECK: nothing was added, so nothing to remove or check.
