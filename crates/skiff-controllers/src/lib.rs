//! The controller manager (placeholder: being built).

/// Options of the controller manager.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Controllers to run (empty: all).
    pub controllers: Vec<String>,
}

/// Runs every controller until an unrecoverable error.
pub async fn run(client: kube::Client, options: Options) -> anyhow::Result<()> {
    let _ = (client, options);
    std::future::pending::<()>().await;
    Ok(())
}
