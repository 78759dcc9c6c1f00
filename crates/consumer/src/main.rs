//! What a user's controller writes to use both crates: checked to build,
//! never run.

use std::sync::Arc;

use kube_lease_fence::{Elector, LeaderConfig, default_identity, may_write};
use kube_secure_metrics::{Readiness, probes_router};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?;
    let identity = default_identity("POD_NAME", "my-controller");
    let cfg = LeaderConfig::new("my-controller", "default", identity);
    let mut elector = Elector::new(client, cfg)?;
    elector.acquire().await;
    let gate = elector.gate();
    let readiness = Arc::new(Readiness::default());
    let _probes = probes_router(readiness);
    if may_write(Some(&gate)) {
        println!("leading");
    }
    println!("{}", elector.hold().await);
    Ok(())
}
