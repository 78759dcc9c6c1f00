//! What the benchmark's clients share: their arguments and a client that
//! names itself, so the audit log tells each client from the controller.

use kube::{Client, Config};

/// The `N` positional arguments after cargo's own `--bench`, or a usage error.
pub fn args<const N: usize>(usage: &str) -> Result<[String; N], String> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    args.try_into().map_err(|_| format!("usage: {usage}"))
}

/// A client for the current kubeconfig with this `user_agent`.
pub async fn client(user_agent: &'static str) -> Result<Client, Box<dyn std::error::Error>> {
    let mut config = Config::infer().await?;
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(user_agent)));
    Ok(Client::try_from(config)?)
}
