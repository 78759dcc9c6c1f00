//! A TCP relay to the API server whose client-to-server direction can be
//! held: what a client is in the middle of sending stays in flight until
//! the test lets it go.

use super::kubeconfig_path;

/// A TCP relay to the API server whose client-to-server direction can be
/// held: what the client sends meanwhile waits in the relay, as in a
/// congested network, and goes on to the API server on release. TLS passes
/// through untouched (the server's certificate names 127.0.0.1). It runs on
/// a thread of its own, so the test's blocking calls (the audit log's
/// reader) never hold it.
pub struct HeldRelay {
    held: tokio::sync::watch::Sender<bool>,
    pub port: u16,
}

impl HeldRelay {
    pub fn start() -> Self {
        let kubeconfig: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig_path()).unwrap()).unwrap();
        let server = kubeconfig["clusters"][0]["cluster"]["server"].as_str().unwrap();
        let target = server.trim_start_matches("https://").to_owned();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (held, state) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let mut dropped = state.clone();
                loop {
                    tokio::select! {
                        accepted = listener.accept() => {
                            let Ok((inbound, _)) = accepted else { continue };
                            tokio::spawn(relay_held(inbound, target.clone(), state.clone()));
                        }
                        // The relay was dropped: stop.
                        changed = dropped.changed() => if changed.is_err() { return },
                    }
                }
            });
        });
        HeldRelay { held, port }
    }

    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

/// One connection through a [`HeldRelay`]: the answers always pass; what
/// the client sends is read and passed on only while not held (unread, it
/// waits in the sockets).
async fn relay_held(inbound: tokio::net::TcpStream, target: String, held: tokio::sync::watch::Receiver<bool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else { return };
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_server, mut to_server) = outbound.into_split();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut held = held;
        loop {
            held.wait_for(|h| !*h).await.ok()?;
            let n = from_client.read(&mut buf).await.ok()?;
            if n == 0 {
                return to_server.shutdown().await.ok();
            }
            // Read as the hold began: it waits too.
            held.wait_for(|h| !*h).await.ok()?;
            to_server.write_all(&buf[..n]).await.ok()?;
        }
    };
    let down = tokio::io::copy(&mut from_server, &mut to_client);
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

impl HeldRelay {
    /// A copy of `kubeconfig` whose clusters are reached through this
    /// relay; its path.
    pub fn kubeconfig(&self, name: &str, kubeconfig: &str) -> String {
        let mut kc: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
        for cluster in kc["clusters"].as_array_mut().unwrap() {
            cluster["cluster"]["server"] = format!("https://127.0.0.1:{}", self.port).into();
        }
        let path = format!("{}/{name}-relayed-kubeconfig", env!("CARGO_TARGET_TMPDIR"));
        std::fs::write(&path, serde_saphyr::to_string(&kc).unwrap()).unwrap();
        path
    }
}
