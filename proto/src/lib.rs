//! The `inventory.v1` wire API, generated from `proto/inventory/v1/*.proto` at build time.
//! Nothing here is written by hand.

pub mod codec;

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("inventory.v1");
}

/// Encoded `FileDescriptorSet` of the API, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/inventory_descriptor.bin"));
