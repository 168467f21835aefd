//! shardlog's wire formats: the Kafka protocol codec and the inter-broker framed protocol.
//!
//! Empty until the broker issue lands; the storage engine comes first and knows nothing of the network.
