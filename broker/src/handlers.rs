//! Request handlers: one function per API, from a decoded request to a response body.
//!
//! Only what is implemented is listed in [`supported_apis`]; the codec refuses everything else before a
//! handler sees it.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::metadata_response::{MetadataResponseBroker, MetadataResponseTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, MetadataRequest, MetadataResponse, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use shardlog_net::kafka::{DecodedRequest, SupportedApis};

use crate::config::BrokerConfig;

/// The APIs and versions this broker serves. Grows with each handler.
pub fn supported_apis() -> SupportedApis {
    SupportedApis::new(&[(ApiKey::ApiVersions, 0, 4), (ApiKey::Metadata, 0, 12)])
}

/// What a handler needs of the broker.
#[derive(Debug)]
pub struct BrokerContext {
    pub config: BrokerConfig,
    pub apis: SupportedApis,
    pub cluster_id: String,
}

/// Answers a decoded request. Every API in [`supported_apis`] has an arm here.
pub fn handle(ctx: &BrokerContext, request: DecodedRequest) -> ResponseKind {
    match request.body {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(ctx.apis.api_versions_response(0)),
        RequestKind::Metadata(req) => ResponseKind::Metadata(metadata(ctx, &req)),
        other => unreachable!("the codec admitted an API without a handler: {other:?}"),
    }
}

/// Metadata: this broker, and an error for every topic asked about (topic storage comes next).
fn metadata(ctx: &BrokerContext, req: &MetadataRequest) -> MetadataResponse {
    let advertised = &ctx.config.advertised_listener;
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(ctx.config.node_id as i32))
        .with_host(StrBytes::from_string(advertised.host.clone()))
        .with_port(advertised.port as i32);
    let topics = req
        .topics
        .iter()
        .flatten()
        .map(|t| {
            MetadataResponseTopic::default()
                .with_name(t.name.clone())
                .with_topic_id(t.topic_id)
                .with_error_code(ResponseError::UnknownTopicOrPartition.code())
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![broker])
        .with_cluster_id(Some(StrBytes::from_string(ctx.cluster_id.clone())))
        .with_controller_id(BrokerId(ctx.config.node_id as i32))
        .with_topics(topics)
}
