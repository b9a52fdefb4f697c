//! The container runtime as the agent sees it: CRI v1's operations, behind a
//! trait so that the real path (containerd over gRPC, [`crate::cri`]) and the
//! simulated one of hollow nodes ([`crate::sim`]) share the pod logic.
//! The messages are CRI's own types.

use std::time::Duration;

use async_trait::async_trait;
pub use k8s_cri::v1 as cri;

/// A container runtime speaking CRI's vocabulary.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// `<name>://<version>`, as `containerRuntimeVersion` shows it.
    async fn version(&self) -> anyhow::Result<String>;
    /// The image's id if it is present locally.
    async fn image_present(&self, image: &str) -> anyhow::Result<Option<String>>;
    /// Pulls an image; returns its id.
    async fn pull_image(&self, image: &str) -> anyhow::Result<String>;
    /// Pulls an image with registry credentials (CRI `PullImageRequest.auth`;
    /// `None`: anonymously). A runtime without registries ignores them.
    async fn pull_image_auth(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
    ) -> anyhow::Result<String> {
        let _ = auth;
        self.pull_image(image).await
    }
    async fn run_sandbox(&self, config: &cri::PodSandboxConfig) -> anyhow::Result<String>;
    async fn sandbox_status(&self, id: &str) -> anyhow::Result<Option<cri::PodSandboxStatus>>;
    async fn stop_sandbox(&self, id: &str) -> anyhow::Result<()>;
    async fn remove_sandbox(&self, id: &str) -> anyhow::Result<()>;
    /// Sandboxes, all or those of one pod (by uid).
    async fn list_sandboxes(&self, pod_uid: Option<&str>) -> anyhow::Result<Vec<cri::PodSandbox>>;
    async fn create_container(
        &self,
        sandbox: &str,
        config: &cri::ContainerConfig,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> anyhow::Result<String>;
    async fn start_container(&self, id: &str) -> anyhow::Result<()>;
    /// Changes a running container's cpu and memory in place (CRI
    /// `UpdateContainerResources`; it must not restart the container).
    async fn update_container_resources(
        &self,
        id: &str,
        resources: &cri::LinuxContainerResources,
    ) -> anyhow::Result<()> {
        let _ = (id, resources);
        anyhow::bail!("this runtime cannot change a container's resources")
    }
    async fn stop_container(&self, id: &str, timeout_seconds: i64) -> anyhow::Result<()>;
    async fn remove_container(&self, id: &str) -> anyhow::Result<()>;
    /// Containers, all or those of one pod (by uid).
    async fn list_containers(&self, pod_uid: Option<&str>) -> anyhow::Result<Vec<cri::Container>>;
    async fn container_status(&self, id: &str) -> anyhow::Result<Option<cri::ContainerStatus>>;
    /// Runs a command in a container; (exit code, stdout, stderr).
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> anyhow::Result<(i32, Vec<u8>, Vec<u8>)>;
    /// The runtime's streaming URL for an exec session.
    async fn exec(&self, req: cri::ExecRequest) -> anyhow::Result<String>;
    /// The runtime's streaming URL for an attach session.
    async fn attach(&self, req: cri::AttachRequest) -> anyhow::Result<String>;
    /// The runtime's streaming URL for port forwarding into a sandbox.
    async fn port_forward(&self, sandbox: &str, ports: Vec<i32>) -> anyhow::Result<String>;
    /// Resource usage of containers (CRI `ListContainerStats`), all or those
    /// of one pod (by uid): cumulative CPU time, memory working set, usage
    /// and RSS, each with the time the runtime sampled it.
    async fn list_container_stats(
        &self,
        pod_uid: Option<&str>,
    ) -> anyhow::Result<Vec<cri::ContainerStats>>;
    /// What this runtime's containers need from the node.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reads_pod_inputs: true,
            applies_resources: true,
        }
    }
    /// How long this pod's containers are certain not to change state by
    /// themselves, for a runtime that knows (the simulated one: until its
    /// next scheduled exit). `None`: it cannot know, so the agent polls it
    /// (as kubelet's PLEG relists).
    async fn quiet_for(&self, _pod_uid: &str) -> Option<Duration> {
        None
    }
}

/// What a runtime's containers need from the node besides CRI calls; the
/// pod worker's plan reads it (a simulated runtime is a runtime without
/// these needs, not a branch of the worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Its containers are processes that read what the agent prepares for
    /// them on the node: volumes, environment variables (from Secrets,
    /// ConfigMaps and Services), log directories, images pulled with the
    /// pod's pull secrets. The simulated containers of hollow nodes read
    /// none of it.
    pub reads_pod_inputs: bool,
    /// Its containers run in cgroups whose cpu and memory a resize changes
    /// (`UpdateContainerResources`); without them (simulated containers)
    /// a resize is bookkeeping only.
    pub applies_resources: bool,
}

/// Labels the agent puts on sandboxes and containers so it can find them
/// again after a restart.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotation on a container: the pod's terminationGracePeriod and hash of
/// the container's spec, so a changed spec is noticed after a restart too.
pub const ANNOTATION_SPEC_HASH: &str = "io.skiff.container.hash";
pub const ANNOTATION_INIT: &str = "io.skiff.container.init";
