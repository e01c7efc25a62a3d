//! Basket intents in Redis (`lua/basket.lua`): one hash per intent and an index of the
//! open ones, all under the channel's hash tag `{channel}` (the lines' pools live in other
//! slots; all-or-nothing over them is the intent and its compensation, not one script).

use super::reply::{array, int, string, unexpected};
use super::*;

const WHAT: &str = "basket";

impl RedisPoolStore {
    fn basket_keys(&self, channel: &str, basket_id: &str) -> (String, String) {
        let base = format!("{}{}", self.key_prefix, channel_tag(channel));
        (format!("{base}:basket:{basket_id}"), format!("{base}:baskets:open"))
    }

    pub(super) async fn get_basket(&self, channel: &str, basket_id: &str) -> Result<Option<StoredBasket>, StoreError> {
        let (basket, open) = self.basket_keys(channel, basket_id);
        let mut call = self.shared.scripts.basket.key(&basket);
        call.key(&open).arg("get");
        let reply = array(WHAT, self.read(&call).await?)?;
        match reply.as_slice() {
            [v, body, at, now] => stored(v, body, at, now),
            _ => Err(StoreError::Protocol(format!("basket get: unexpected reply {reply:?}"))),
        }
    }

    pub(super) async fn write_basket(
        &self,
        channel: &str,
        basket_id: &str,
        expected_version: u64,
        intent: &Intent,
    ) -> Result<BasketWrite, StoreError> {
        let (basket, open) = self.basket_keys(channel, basket_id);
        let body = serde_json::to_string(intent).map_err(|e| StoreError::Protocol(format!("basket intent: {e}")))?;
        let mut call = self.shared.scripts.basket.key(&basket);
        call.key(&open)
            .arg("put")
            .arg(basket_id)
            .arg(expected_version)
            .arg(body)
            .arg(if intent.is_open() { "1" } else { "0" })
            .arg(duration_ms(BASKET_RETENTION));
        let reply = array(WHAT, self.write(&basket, &call).await?)?;
        match reply.as_slice() {
            [ok, v, _] if int(WHAT, ok)? == 1 => Ok(BasketWrite::Written { version: uint(WHAT, v)? }),
            [_, v, body, at, now] => Ok(BasketWrite::Conflict(stored(v, body, at, now)?)),
            _ => Err(StoreError::Protocol(format!("basket put: unexpected reply {reply:?}"))),
        }
    }

    pub(super) async fn list_open_baskets(&self, channel: &str, max: u64) -> Result<Vec<String>, StoreError> {
        let (_, open) = self.basket_keys(channel, "");
        let mut call = self.shared.scripts.basket.key(&open);
        call.key(&open).arg("open").arg(max.max(1));
        array(WHAT, self.read(&call).await?)?.iter().map(|v| string(WHAT, v)).collect()
    }
}

fn stored(v: &Value, body: &Value, at: &Value, now: &Value) -> Result<Option<StoredBasket>, StoreError> {
    let version = uint(WHAT, v)?;
    if version == 0 {
        return Ok(None);
    }
    let intent = serde_json::from_str(&string(WHAT, body)?).map_err(|_| unexpected(WHAT, body))?;
    Ok(Some(StoredBasket { intent, version, written_at_ms: int(WHAT, at)?, now_ms: int(WHAT, now)? }))
}
