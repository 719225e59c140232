//! A minimal, blocking CRI (`runtime.v1`) client over containerd's Unix socket: just the
//! calls kubelet makes to run a pod with one container and take it down again.
//!
//! The messages are written out with prost's derive instead of generated from the CRI
//! `api.proto`, so building the test needs no protoc. Field numbers and types follow
//! `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto`; fields the test never sets or reads are
//! left out (protobuf skips unknown fields when decoding).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

pub mod v1 {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VersionRequest {
        #[prost(string, tag = "1")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VersionResponse {
        #[prost(string, tag = "1")]
        pub version: String,
        #[prost(string, tag = "2")]
        pub runtime_name: String,
        #[prost(string, tag = "3")]
        pub runtime_version: String,
        #[prost(string, tag = "4")]
        pub runtime_api_version: String,
    }

    /// `Protocol`: TCP = 0, UDP = 1, SCTP = 2.
    pub const PROTOCOL_TCP: i32 = 0;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PortMapping {
        #[prost(int32, tag = "1")]
        pub protocol: i32,
        #[prost(int32, tag = "2")]
        pub container_port: i32,
        #[prost(int32, tag = "3")]
        pub host_port: i32,
        #[prost(string, tag = "4")]
        pub host_ip: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DnsConfig {
        #[prost(string, repeated, tag = "1")]
        pub servers: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub searches: Vec<String>,
        #[prost(string, repeated, tag = "3")]
        pub options: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxMetadata {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub uid: String,
        #[prost(string, tag = "3")]
        pub namespace: String,
        #[prost(uint32, tag = "4")]
        pub attempt: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LinuxPodSandboxConfig {
        #[prost(string, tag = "1")]
        pub cgroup_parent: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxConfig {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<PodSandboxMetadata>,
        #[prost(string, tag = "2")]
        pub hostname: String,
        #[prost(string, tag = "3")]
        pub log_directory: String,
        #[prost(message, optional, tag = "4")]
        pub dns_config: Option<DnsConfig>,
        #[prost(message, repeated, tag = "5")]
        pub port_mappings: Vec<PortMapping>,
        #[prost(map = "string, string", tag = "6")]
        pub labels: HashMap<String, String>,
        #[prost(map = "string, string", tag = "7")]
        pub annotations: HashMap<String, String>,
        #[prost(message, optional, tag = "8")]
        pub linux: Option<LinuxPodSandboxConfig>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunPodSandboxRequest {
        #[prost(message, optional, tag = "1")]
        pub config: Option<PodSandboxConfig>,
        #[prost(string, tag = "2")]
        pub runtime_handler: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunPodSandboxResponse {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
    }

    /// `StopPodSandboxRequest`, `RemovePodSandboxRequest` and `PodSandboxStatusRequest`
    /// share this shape; `verbose` (field 2) exists only in the last, and is only sent
    /// there (false is the default, which protobuf does not encode).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxIdRequest {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
        #[prost(bool, tag = "2")]
        pub verbose: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodIp {
        #[prost(string, tag = "1")]
        pub ip: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxNetworkStatus {
        #[prost(string, tag = "1")]
        pub ip: String,
        #[prost(message, repeated, tag = "2")]
        pub additional_ips: Vec<PodIp>,
    }

    /// `PodSandboxState`: SANDBOX_READY = 0, SANDBOX_NOTREADY = 1.
    pub const SANDBOX_READY: i32 = 0;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxStatus {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(int32, tag = "3")]
        pub state: i32,
        #[prost(message, optional, tag = "5")]
        pub network: Option<PodSandboxNetworkStatus>,
        #[prost(map = "string, string", tag = "8")]
        pub annotations: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxStatusResponse {
        #[prost(message, optional, tag = "1")]
        pub status: Option<PodSandboxStatus>,
        #[prost(map = "string, string", tag = "2")]
        pub info: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageSpec {
        #[prost(string, tag = "1")]
        pub image: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerMetadata {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(uint32, tag = "2")]
        pub attempt: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerConfig {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ContainerMetadata>,
        #[prost(message, optional, tag = "2")]
        pub image: Option<ImageSpec>,
        #[prost(string, repeated, tag = "3")]
        pub command: Vec<String>,
        #[prost(string, repeated, tag = "4")]
        pub args: Vec<String>,
        #[prost(string, tag = "11")]
        pub log_path: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateContainerRequest {
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
        #[prost(message, optional, tag = "2")]
        pub config: Option<ContainerConfig>,
        #[prost(message, optional, tag = "3")]
        pub sandbox_config: Option<PodSandboxConfig>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateContainerResponse {
        #[prost(string, tag = "1")]
        pub container_id: String,
    }

    /// `StartContainerRequest` and `ContainerStatusRequest` share this shape (as above,
    /// `verbose` is only ever set in the second).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerIdRequest {
        #[prost(string, tag = "1")]
        pub container_id: String,
        #[prost(bool, tag = "2")]
        pub verbose: bool,
    }

    /// `ContainerState`: CREATED = 0, RUNNING = 1, EXITED = 2, UNKNOWN = 3.
    pub const CONTAINER_RUNNING: i32 = 1;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerStatus {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(int32, tag = "3")]
        pub state: i32,
        #[prost(int32, tag = "7")]
        pub exit_code: i32,
        #[prost(string, tag = "10")]
        pub reason: String,
        #[prost(string, tag = "11")]
        pub message: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerStatusResponse {
        #[prost(message, optional, tag = "1")]
        pub status: Option<ContainerStatus>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(int32, tag = "4")]
        pub state: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        #[prost(message, repeated, tag = "1")]
        pub items: Vec<PodSandbox>,
    }
}

/// How long one CRI call may take before the test fails instead of hanging.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection to one containerd's CRI service.
pub struct CriClient {
    rt: tokio::runtime::Runtime,
    grpc: tonic::client::Grpc<Channel>,
}

impl CriClient {
    /// Connects to the gRPC socket at `socket` (the URI is a placeholder: every connection
    /// goes to the socket).
    pub fn connect(socket: &Path) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building a tokio runtime")?;
        let path: PathBuf = socket.to_path_buf();
        let channel = rt.block_on(async move {
            Endpoint::try_from("http://[::]:50051")?
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let s = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(s))
                    }
                }))
                .await
        });
        let channel =
            channel.with_context(|| format!("connecting to CRI at {}", socket.display()))?;
        Ok(Self {
            rt,
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// One unary call of `/runtime.v1.RuntimeService/<method>`.
    fn call<Req, Resp>(&mut self, method: &'static str, req: Req) -> Result<Resp>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let grpc = &mut self.grpc;
        let path =
            http::uri::PathAndQuery::try_from(format!("/runtime.v1.RuntimeService/{method}"))
                .expect("valid path");
        let fut = async move {
            grpc.ready().await.context("CRI channel not ready")?;
            let codec = tonic::codec::ProstCodec::<Req, Resp>::default();
            let resp = grpc
                .unary(tonic::Request::new(req), path, codec)
                .await
                .map_err(|s| anyhow::anyhow!("{} {:?}: {}", method, s.code(), s.message()))?;
            Ok::<_, anyhow::Error>(resp.into_inner())
        };
        self.rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, fut).await })
            .map_err(|_| anyhow::anyhow!("CRI {method} took more than {CALL_TIMEOUT:?}"))?
    }

    pub fn version(&mut self) -> Result<v1::VersionResponse> {
        self.call(
            "Version",
            v1::VersionRequest {
                version: "v1".into(),
            },
        )
    }

    pub fn run_pod_sandbox(&mut self, config: &v1::PodSandboxConfig) -> Result<String> {
        let r: v1::RunPodSandboxResponse = self.call(
            "RunPodSandbox",
            v1::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            },
        )?;
        Ok(r.pod_sandbox_id)
    }

    pub fn pod_sandbox_status(&mut self, id: &str) -> Result<v1::PodSandboxStatusResponse> {
        self.call(
            "PodSandboxStatus",
            v1::PodSandboxIdRequest {
                pod_sandbox_id: id.into(),
                verbose: true,
            },
        )
    }

    pub fn stop_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let _: v1::Empty = self.call(
            "StopPodSandbox",
            v1::PodSandboxIdRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            },
        )?;
        Ok(())
    }

    pub fn remove_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let _: v1::Empty = self.call(
            "RemovePodSandbox",
            v1::PodSandboxIdRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            },
        )?;
        Ok(())
    }

    pub fn list_pod_sandboxes(&mut self) -> Result<Vec<v1::PodSandbox>> {
        let r: v1::ListPodSandboxResponse =
            self.call("ListPodSandbox", v1::ListPodSandboxRequest {})?;
        Ok(r.items)
    }

    pub fn create_container(
        &mut self,
        sandbox_id: &str,
        config: &v1::ContainerConfig,
        sandbox_config: &v1::PodSandboxConfig,
    ) -> Result<String> {
        let r: v1::CreateContainerResponse = self.call(
            "CreateContainer",
            v1::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.into(),
                config: Some(config.clone()),
                sandbox_config: Some(sandbox_config.clone()),
            },
        )?;
        Ok(r.container_id)
    }

    pub fn start_container(&mut self, id: &str) -> Result<()> {
        let _: v1::Empty = self.call(
            "StartContainer",
            v1::ContainerIdRequest {
                container_id: id.into(),
                verbose: false,
            },
        )?;
        Ok(())
    }

    pub fn container_status(&mut self, id: &str) -> Result<v1::ContainerStatus> {
        let r: v1::ContainerStatusResponse = self.call(
            "ContainerStatus",
            v1::ContainerIdRequest {
                container_id: id.into(),
                verbose: false,
            },
        )?;
        r.status.context("ContainerStatus without a status")
    }
}

/// `{"k": "v", ...}` from pairs.
pub fn string_map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
