//! The header and the static archive from C: `c/plan.c` compiled with the
//! system C compiler against `include/cocoon_fixup.h` and
//! `libcocoon_fixup.a`, run on a bundled example and on a broken pod.

mod support;

use std::path::Path;
use std::process::Command;

use support::{built, crate_dir};

#[test]
fn a_c_program_plans_through_the_header_and_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("plan");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let built = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("c/plan.c"))
        .arg(format!("-L{}", built().display()))
        .args(["-l:libcocoon_fixup.a", "-ldl", "-lm", "-lpthread", "-o"])
        .arg(&program)
        .output()
        .unwrap_or_else(|e| {
            panic!("running {cc}: {e} (a C compiler is needed: apt-get install gcc)")
        });
    assert!(
        built.status.success(),
        "compiling c/plan.c failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let examples = crate_dir().join("../../examples");
    let options = format!(
        r#"{{"no_cache": true, "plugin_dir": "", "cocoon_root": "{}"}}"#,
        examples.join("cocoon-root").display()
    );
    let run = |pod: &Path| {
        Command::new(&program)
            .arg(pod)
            .arg(examples.join("oci-static/vm.json"))
            .arg(&options)
            .output()
            .unwrap()
    };
    let out = run(&examples.join("oci-static/pod.json"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["needs_fixup"], true);
    assert_eq!(report["scenario"], "oci-networkd");
    assert_eq!(report["binding"]["verdict"], "bound");

    let broken = dir.path().join("pod.json");
    std::fs::write(&broken, "{\"kind\": \"Pod\"").unwrap();
    let out = run(&broken);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error 2: pod: malformed JSON"),
        "{stderr}"
    );
}
