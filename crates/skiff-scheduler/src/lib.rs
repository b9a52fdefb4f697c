//! The scheduler (placeholder: being built).

/// Options of the scheduler.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A KubeSchedulerConfiguration file (YAML or JSON).
    pub config_file: Option<std::path::PathBuf>,
}

/// Runs the scheduler until an unrecoverable error.
pub async fn run(client: kube::Client, options: Options) -> anyhow::Result<()> {
    let _ = (client, options);
    std::future::pending::<()>().await;
    Ok(())
}
