//! The real runtime: CRI v1 over gRPC on containerd's Unix socket.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::runtime::Runtime;

const MAX_MESSAGE: usize = 64 << 20;

/// A CRI client.
#[derive(Clone)]
pub struct Cri {
    channel: Channel,
    pub socket: PathBuf,
}

fn not_found(e: &tonic::Status) -> bool {
    e.code() == tonic::Code::NotFound
}

impl Cri {
    pub async fn connect(socket: &Path) -> Result<Cri> {
        let path = socket.to_path_buf();
        let channel = Endpoint::try_from("http://[::]:0")?
            .connect_timeout(std::time::Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    let s = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(s))
                }
            }))
            .await
            .with_context(|| format!("connecting to CRI at {}", socket.display()))?;
        Ok(Cri {
            channel,
            socket: socket.to_path_buf(),
        })
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    fn img(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    pub async fn version(&self) -> Result<cri::VersionResponse> {
        Ok(self
            .rt()
            .version(cri::VersionRequest {
                version: "v1".into(),
            })
            .await?
            .into_inner())
    }
}

#[async_trait]
impl Runtime for Cri {
    async fn version(&self) -> Result<String> {
        let v = Cri::version(self).await?;
        Ok(format!("{}://{}", v.runtime_name, v.runtime_version))
    }

    async fn image_present(&self, image: &str) -> Result<Option<String>> {
        let r = self
            .img()
            .image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await?
            .into_inner();
        Ok(r.image.map(|i| i.id))
    }

    async fn pull_image(&self, image: &str) -> Result<String> {
        self.pull_image_auth(image, None).await
    }

    async fn pull_image_auth(&self, image: &str, auth: Option<cri::AuthConfig>) -> Result<String> {
        let r = self
            .img()
            .pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                auth,
                ..Default::default()
            })
            .await
            // The runtime's own message (the registry's answer), not
            // tonic's rendering of the whole status.
            .map_err(|s| anyhow::anyhow!("{}", s.message()))?
            .into_inner();
        Ok(r.image_ref)
    }

    async fn run_sandbox(&self, config: &cri::PodSandboxConfig) -> Result<String> {
        let r = self
            .rt()
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await?
            .into_inner();
        Ok(r.pod_sandbox_id)
    }

    async fn sandbox_status(&self, id: &str) -> Result<Option<cri::PodSandboxStatus>> {
        match self
            .rt()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            })
            .await
        {
            Ok(r) => Ok(r.into_inner().status),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn stop_sandbox(&self, id: &str) -> Result<()> {
        match self
            .rt()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn remove_sandbox(&self, id: &str) -> Result<()> {
        match self
            .rt()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn list_sandboxes(&self, pod_uid: Option<&str>) -> Result<Vec<cri::PodSandbox>> {
        let filter = pod_uid.map(|uid| cri::PodSandboxFilter {
            label_selector: pod_uid_selector(uid),
            ..Default::default()
        });
        Ok(self
            .rt()
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter })
            .await?
            .into_inner()
            .items)
    }

    async fn create_container(
        &self,
        sandbox: &str,
        config: &cri::ContainerConfig,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<String> {
        let r = self
            .rt()
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.into(),
                config: Some(config.clone()),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await?
            .into_inner();
        Ok(r.container_id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        self.rt()
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await?;
        Ok(())
    }

    async fn update_container_resources(
        &self,
        id: &str,
        resources: &cri::LinuxContainerResources,
    ) -> Result<()> {
        self.rt()
            .update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: id.into(),
                linux: Some(resources.clone()),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout_seconds: i64) -> Result<()> {
        match self
            .rt()
            .stop_container(cri::StopContainerRequest {
                container_id: id.into(),
                timeout: timeout_seconds,
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        match self
            .rt()
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.into(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn list_containers(&self, pod_uid: Option<&str>) -> Result<Vec<cri::Container>> {
        let filter = pod_uid.map(|uid| cri::ContainerFilter {
            label_selector: pod_uid_selector(uid),
            ..Default::default()
        });
        Ok(self
            .rt()
            .list_containers(cri::ListContainersRequest { filter })
            .await?
            .into_inner()
            .containers)
    }

    async fn container_status(&self, id: &str) -> Result<Option<cri::ContainerStatus>> {
        match self
            .rt()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
        {
            Ok(r) => Ok(r.into_inner().status),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        let r = self
            .rt()
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.into(),
                cmd,
                timeout: timeout_seconds,
            })
            .await?
            .into_inner();
        Ok((r.exit_code, r.stdout, r.stderr))
    }

    async fn exec(&self, req: cri::ExecRequest) -> Result<String> {
        Ok(self.rt().exec(req).await?.into_inner().url)
    }

    async fn attach(&self, req: cri::AttachRequest) -> Result<String> {
        Ok(self.rt().attach(req).await?.into_inner().url)
    }

    async fn list_container_stats(
        &self,
        pod_uid: Option<&str>,
    ) -> Result<Vec<cri::ContainerStats>> {
        let filter = pod_uid.map(|uid| cri::ContainerStatsFilter {
            label_selector: pod_uid_selector(uid),
            ..Default::default()
        });
        Ok(self
            .rt()
            .list_container_stats(cri::ListContainerStatsRequest { filter })
            .await?
            .into_inner()
            .stats)
    }

    async fn port_forward(&self, sandbox: &str, ports: Vec<i32>) -> Result<String> {
        Ok(self
            .rt()
            .port_forward(cri::PortForwardRequest {
                pod_sandbox_id: sandbox.into(),
                port: ports,
            })
            .await?
            .into_inner()
            .url)
    }
}

/// The CRI label selector of one pod's sandboxes, containers or stats.
fn pod_uid_selector(uid: &str) -> std::collections::HashMap<String, String> {
    [(crate::runtime::LABEL_POD_UID.to_string(), uid.to_string())]
        .into_iter()
        .collect()
}
