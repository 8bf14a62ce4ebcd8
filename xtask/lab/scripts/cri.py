"""A minimal CRI client for the lab's private containerd (no crictl in Debian 12), and the
pause image it runs. Protobuf messages are encoded by hand: the few fields used here are
from the CRI v1 API (k8s.io/cri-api pkg/apis/runtime/v1/api.proto).

  cri.py version SOCKET
  cri.py run SOCKET NAMESPACE NAME UID CGROUP_PARENT    -> prints the sandbox id
  cri.py stop|remove SOCKET SANDBOX_ID
  cri.py image BUSYBOX ARCHIVE REFERENCE                -> an oci-archive of a pause image
"""

import hashlib
import io
import json
import sys
import tarfile


def varint(n):
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def field(number, payload):
    """A length-delimited field (string or embedded message)."""
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def first_string(message):
    """Field 1 of a message, a string (every response read here has only that)."""
    if not message or message[0] != 0x0A:
        raise SystemExit(f"unexpected response {message!r}")
    length, i, shift = 0, 1, 0
    while True:
        byte = message[i]
        length |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if not byte & 0x80:
            return message[i : i + length].decode()


def call(socket, method, request):
    import grpc  # Debian's python3-grpcio

    with grpc.insecure_channel("unix://" + socket) as channel:
        stub = channel.unary_unary(
            "/runtime.v1.RuntimeService/" + method,
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        return stub(request, timeout=60)


def run_sandbox(socket, namespace, name, uid, cgroup_parent):
    # PodSandboxMetadata{name=1, uid=2, namespace=3}
    metadata = field(1, name) + field(2, uid) + field(3, namespace)
    # LinuxPodSandboxConfig{cgroup_parent=1}
    linux = field(1, cgroup_parent)
    # PodSandboxConfig{metadata=1, hostname=2, labels=6, linux=8}, as kubelet fills them
    config = (
        field(1, metadata)
        + field(2, name)
        + field(6, field(1, "io.kubernetes.pod.name") + field(2, name))
        + field(6, field(1, "io.kubernetes.pod.namespace") + field(2, namespace))
        + field(8, linux)
    )
    # RunPodSandboxRequest{config=1} -> RunPodSandboxResponse{pod_sandbox_id=1}
    return first_string(call(socket, "RunPodSandbox", field(1, config)))


def tar(files):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def descriptor(media_type, blob):
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}


def image(binary, archive, reference):
    """A scratch image whose entrypoint sleeps forever (a static busybox): a pause container."""
    with open(binary, "rb") as f:
        layer = tar([("busybox", f.read(), 0o755)])
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/busybox", "sleep", "2147483647"]},
        "rootfs": {"type": "layers", "diff_ids": [descriptor("", layer)["digest"]]},
    }).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
    }).encode()
    entry = descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
    entry["annotations"] = {
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[-1],
    }
    files = [
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
        ("index.json", json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode(), 0o644),
    ]
    for blob in (layer, config, manifest):
        files.append(("blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob, 0o644))
    with open(archive, "wb") as f:
        f.write(tar(files))


def main(args):
    command = args[0]
    if command == "version":
        # VersionRequest{version=1} -> VersionResponse{version=1, runtime_name=2, ...}
        print(first_string(call(args[1], "Version", field(1, "v1"))))
    elif command == "run":
        print(run_sandbox(*args[1:6]))
    elif command in ("stop", "remove"):
        method = {"stop": "StopPodSandbox", "remove": "RemovePodSandbox"}[command]
        call(args[1], method, field(1, args[2]))
    elif command == "image":
        image(*args[1:4])
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
