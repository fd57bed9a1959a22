//! Name-based UUIDs (RFC 9562, version 5: SHA-1 of a namespace and a name).
//!
//! Every NetworkManager connection needs a UUID. A random one would change
//! on every retry and every clone, and the sandbox has no randomness anyway
//! (asking for it traps). A name-based UUID is the same for the same MAC on
//! every run, so a retried plan rewrites the same connection, and it differs
//! between MACs. SHA-1 is used here as the RFC prescribes, not for secrecy.

/// The namespace of this plugin's connection UUIDs: the version 5 UUID of
/// the URL `https://cocoonstack.io/cocoon-fixup/nm-keyfile` in the RFC's
/// URL namespace (`b85c816f-e1fe-546d-9127-c7922625a399`).
pub const NAMESPACE: [u8; 16] = [
    0xb8, 0x5c, 0x81, 0x6f, 0xe1, 0xfe, 0x54, 0x6d, 0x91, 0x27, 0xc7, 0x92, 0x26, 0x25, 0xa3, 0x99,
];

/// The version 5 UUID of `name` in `namespace`, as
/// `xxxxxxxx-xxxx-5xxx-yxxx-xxxxxxxxxxxx` in lowercase hex.
pub fn v5(namespace: &[u8; 16], name: &[u8]) -> String {
    let mut input = Vec::with_capacity(namespace.len() + name.len());
    input.extend_from_slice(namespace);
    input.extend_from_slice(name);
    let digest = sha1(&input);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x50; // version 5
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // the RFC variant
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// SHA-1 (FIPS 180-4). A few hundred bytes per plan: the cost is nothing
/// against the host's fuel limit.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut message = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&bit_len.to_be_bytes());

    for block in message.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, &word) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(word);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (state, add) in h.iter_mut().zip([a, b, c, d, e]) {
            *state = state.wrapping_add(add);
        }
    }

    let mut out = [0u8; 20];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9562's URL namespace, `6ba7b811-9dad-11d1-80b4-00c04fd430c8`.
    const URL_NAMESPACE: [u8; 16] = [
        0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30,
        0xc8,
    ];

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha1_matches_the_fips_vectors() {
        assert_eq!(hex(&sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(
            hex(&sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        // Several blocks, and a length that is not a multiple of 64.
        assert_eq!(
            hex(&sha1(&[b'a'; 1000])),
            "291e9a6c66994949b57ba5e650361e98fc36b1ba"
        );
    }

    #[test]
    fn the_namespace_is_the_url_uuid_it_claims_to_be() {
        let expected = v5(
            &URL_NAMESPACE,
            b"https://cocoonstack.io/cocoon-fixup/nm-keyfile",
        );
        assert_eq!(expected, "b85c816f-e1fe-546d-9127-c7922625a399");
        assert_eq!(expected.replace('-', ""), hex(&NAMESPACE));
    }

    /// Expected values from Python's `uuid.uuid5(namespace, mac)`.
    #[test]
    fn v5_matches_an_independent_implementation() {
        for (mac, uuid) in [
            ("52:54:00:12:34:56", "77d97f31-00fb-587b-b091-12340076b20a"),
            ("52:54:00:3a:91:0c", "3599da3d-0cf8-5a88-a248-675eaea8c06f"),
            ("fa:16:3e:01:02:03", "ae059d46-40fb-5bb0-873d-e84bd8e3c6aa"),
        ] {
            assert_eq!(v5(&NAMESPACE, mac.as_bytes()), uuid, "{mac}");
        }
    }
}
