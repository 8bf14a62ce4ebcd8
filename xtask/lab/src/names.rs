//! kube-proxy's chain names: hashes of the Service port name, protocol and endpoint.

use sha2::{Digest, Sha256};

/// RFC 4648 base32 with the standard alphabet and `=` padding (Go's `base32.StdEncoding`).
fn base32_std(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    for chunk in bytes.chunks(5) {
        let mut block = [0u8; 5];
        block[..chunk.len()].copy_from_slice(chunk);
        let bits = block.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        // Characters that carry at least one input bit; the rest of the 8 are padding.
        let used = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < used {
                let idx = (bits >> (35 - 5 * i)) & 0x1f;
                out.push(char::from(ALPHABET[idx as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn sha256_base32(input: &str) -> String {
    base32_std(&Sha256::digest(input.as_bytes()))
}

/// `portProtoHash`: first 16 characters of base32(sha256(servicePortName + protocol)).
fn port_proto_hash(service_port_name: &str, proto: &str) -> String {
    sha256_base32(&format!("{service_port_name}{proto}"))[..16].to_string()
}

/// iptables `KUBE-SVC-*`: the Service port's Cluster-policy chain.
pub fn ipt_svc_chain(service_port_name: &str, proto: &str) -> String {
    format!("KUBE-SVC-{}", port_proto_hash(service_port_name, proto))
}

/// iptables `KUBE-SVL-*`: the Service port's Local-policy chain (this node's endpoints).
pub fn ipt_svl_chain(service_port_name: &str, proto: &str) -> String {
    format!("KUBE-SVL-{}", port_proto_hash(service_port_name, proto))
}

/// iptables `KUBE-EXT-*`: the Service port's external (NodePort...) chain.
pub fn ipt_ext_chain(service_port_name: &str, proto: &str) -> String {
    format!("KUBE-EXT-{}", port_proto_hash(service_port_name, proto))
}

/// iptables `KUBE-SEP-*`: one endpoint (`ip:port`) of the Service port.
pub fn ipt_sep_chain(service_port_name: &str, proto: &str, endpoint: &str) -> String {
    let hash = sha256_base32(&format!("{service_port_name}{proto}{endpoint}"));
    format!("KUBE-SEP-{}", &hash[..16])
}

/// nftables `hashAndTruncate`: 8 hash characters, `-`, then the readable name.
fn nft_hash_and_truncate(name: &str) -> String {
    // knftables.NameLengthMax (256) minus the 16-character prefix allowance.
    const BASE_MAX: usize = 256 - 16;
    let named = format!("{}-{name}", &sha256_base32(name)[..8]);
    if named.len() > BASE_MAX {
        format!("{}...", &named[..BASE_MAX - 3])
    } else {
        named
    }
}

/// nftables `servicePortChainNameBase`: `HASH-ns/name/proto/port`.
pub fn nft_service_base(namespace: &str, name: &str, proto: &str, port_name: &str) -> String {
    nft_hash_and_truncate(&format!("{namespace}/{name}/{proto}/{port_name}"))
}

/// nftables `servicePortEndpointChainNameBase`: `HASH-ns/name/proto/port__ip/port`, an
/// IPv6 endpoint's `:` written `.` (chain names may not hold `:`).
pub fn nft_endpoint_base(
    namespace: &str,
    name: &str,
    proto: &str,
    port_name: &str,
    endpoint: impl Into<std::net::SocketAddr>,
) -> String {
    let endpoint = endpoint.into();
    let ip = endpoint.ip().to_string().replace(':', ".");
    nft_hash_and_truncate(&format!(
        "{namespace}/{name}/{proto}/{port_name}__{ip}/{}",
        endpoint.port()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_rfc4648_vectors() {
        assert_eq!(base32_std(b""), "");
        assert_eq!(base32_std(b"f"), "MY======");
        assert_eq!(base32_std(b"fo"), "MZXQ====");
        assert_eq!(base32_std(b"foo"), "MZXW6===");
        assert_eq!(base32_std(b"foob"), "MZXW6YQ=");
        assert_eq!(base32_std(b"fooba"), "MZXW6YTB");
        assert_eq!(base32_std(b"foobar"), "MZXW6YTBOI======");
    }

    // Expected names are copied from kube-proxy's own unit tests (proxier_test.go).
    #[test]
    fn iptables_names_match_kube_proxy_tests() {
        assert_eq!(
            ipt_svc_chain("ns1/svc1:p80", "tcp"),
            "KUBE-SVC-XPGD46QRK7WJZT7O"
        );
        assert_eq!(
            ipt_svc_chain("ns2/svc2:p8080", "tcp"),
            "KUBE-SVC-2VJB64SDSIJUP5T6"
        );
        assert_eq!(
            ipt_sep_chain("ns1/svc1:p80", "tcp", "10.180.0.1:80"),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        assert_eq!(
            ipt_sep_chain("ns1/svc1:p80", "tcp", "10.180.2.1:80"),
            "KUBE-SEP-ZX7GRIZKSNUQ3LAJ"
        );
        assert_eq!(
            ipt_sep_chain("ns1/svc1:p80", "tcp", "10.0.1.1:80"),
            "KUBE-SEP-SNQ3ZNILQDEJNDQO"
        );
        // Same hash as KUBE-SVC-, different prefix.
        assert_eq!(
            ipt_ext_chain("ns1/svc1:p80", "tcp"),
            "KUBE-EXT-XPGD46QRK7WJZT7O"
        );
    }

    #[test]
    fn nftables_names_match_kube_proxy_tests() {
        assert_eq!(
            nft_service_base("ns1", "svc1", "tcp", "p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            nft_endpoint_base(
                "ns1",
                "svc1",
                "tcp",
                "p80",
                "10.180.0.1:80".parse::<std::net::SocketAddrV4>().unwrap()
            ),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        let v6 = nft_endpoint_base(
            "ns1",
            "svc1",
            "tcp",
            "p80",
            "[fd00:10:180::1]:80"
                .parse::<std::net::SocketAddr>()
                .unwrap(),
        );
        assert!(v6.ends_with("-ns1/svc1/tcp/p80__fd00.10.180..1/80"), "{v6}");
    }

    #[test]
    fn long_nft_names_are_truncated_with_an_ellipsis() {
        let long = "n".repeat(300);
        let base = nft_service_base(&long, "svc", "tcp", "p");
        assert_eq!(base.len(), 240);
        assert!(base.ends_with("..."));
    }
}
