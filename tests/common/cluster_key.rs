//! The cluster key the test and bench clusters share: one file under
//! Cargo's per-target temporary directory, written once (atomically, so
//! that test processes running at once never see half a key).

use std::path::PathBuf;
use std::sync::OnceLock;

/// A key file for `--cluster-key-file` (48 bytes: above the 32 required).
pub fn cluster_key_file() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join("baton-test-cluster.key");
        let tmp = dir.join(format!("baton-test-cluster.key.{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the target tmp dir");
        std::fs::write(&tmp, "baton-test-cluster-key-not-a-secret-0123456789\n")
            .expect("write the cluster key");
        std::fs::rename(&tmp, &path).expect("put the cluster key in place");
        path.to_string_lossy().into_owned()
    })
}
