//! The gRPC codec of the API: prost encoding, with one difference from the stock codec —
//! a request that does not decode (for example a string field holding invalid UTF-8) is
//! INVALID_ARGUMENT, not INTERNAL: the caller sent garbage, the server is fine.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

#[derive(Debug, Clone)]
pub struct StrictCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = StrictDecoder<T, U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

pub struct StrictDecoder<T, U>(<ProstCodec<T, U> as Codec>::Decoder)
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static;

impl<T, U> Decoder for StrictDecoder<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            if s.code() == Code::Internal {
                Status::invalid_argument(format!("malformed message: {}", s.message()))
            } else {
                s
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
