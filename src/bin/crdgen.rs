//! Print a CustomResourceDefinition as YAML: the Foo's (`cargo run --bin
//! crdgen`, crds/), or with `leader-fence` the LeaderFence's, the leader
//! fence's parameter (deploy/11-leader-fence-crd.yaml); or, with
//! `deployment-writes-policy`, the admission policy that confines the
//! operator's ServiceAccount (deploy/13-deployment-writes-policy.yaml).

#![warn(clippy::too_many_lines)]

use std::collections::BTreeMap;

use kube::CustomResourceExt;
use sample_controller::{Foo, LeaderFence, confinement_policy_file};

/// The labels Kubernetes recommends, as every object of deploy/ has them.
fn deploy_labels(component: &str) -> BTreeMap<String, String> {
    [
        ("name", "sample-controller"),
        ("instance", "sample-controller"),
        ("version", env!("CARGO_PKG_VERSION")),
        ("component", component),
        ("part-of", "sample-controller"),
        ("managed-by", "kubectl"),
    ]
    .into_iter()
    .map(|(k, v)| (format!("app.kubernetes.io/{k}"), v.to_owned()))
    .collect()
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("deployment-writes-policy") {
        let labels = serde_json::to_value(deploy_labels("confinement")).unwrap_or_default();
        match confinement_policy_file(labels) {
            Ok(file) => print!("{file}"),
            Err(e) => {
                eprintln!("crdgen: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let crd = match std::env::args().nth(1).as_deref() {
        None => Foo::crd(),
        Some("leader-fence") => {
            // It lives in deploy/, whose objects all carry these.
            let mut crd = LeaderFence::crd();
            crd.metadata.labels = Some(deploy_labels("leader-fence"));
            crd
        }
        Some(other) => {
            eprintln!("crdgen: unknown CRD {other:?}; usage: crdgen [leader-fence | deployment-writes-policy]");
            std::process::exit(2);
        }
    };
    match serde_saphyr::to_string(&crd) {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: cannot serialize the CRD: {e}");
            std::process::exit(1);
        }
    }
}
