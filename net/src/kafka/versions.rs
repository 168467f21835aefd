//! The APIs and versions the broker implements, and the ApiVersions answer built from them.
//!
//! A range is only ever advertised if the broker handles it, and it must lie within what the
//! `kafka-protocol` crate can decode and encode (checked when the table is built).

use std::collections::BTreeMap;

use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};

/// Inclusive version range of one API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRange {
    pub min: i16,
    pub max: i16,
}

impl VersionRange {
    pub fn contains(&self, version: i16) -> bool {
        (self.min..=self.max).contains(&version)
    }
}

/// What the broker implements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SupportedApis {
    ranges: BTreeMap<i16, (ApiKey, VersionRange)>,
}

impl SupportedApis {
    /// A table from `(api, min, max)` entries.
    ///
    /// # Panics
    /// When a range is empty or reaches outside what `kafka-protocol` supports for that API: that is a
    /// broker bug, not an operating condition.
    pub fn new(entries: &[(ApiKey, i16, i16)]) -> Self {
        let mut ranges = BTreeMap::new();
        for &(api, min, max) in entries {
            let valid = api.valid_versions();
            assert!(
                min <= max && min >= valid.min && max <= valid.max,
                "{api:?} {min}..={max} is outside what the codec supports ({}..={})",
                valid.min,
                valid.max
            );
            ranges.insert(api as i16, (api, VersionRange { min, max }));
        }
        SupportedApis { ranges }
    }

    /// Every API at every version the codec decodes: for fuzzing and testing the decoder itself, never
    /// for a broker's answer.
    pub fn everything_decodable() -> Self {
        let entries: Vec<_> = (0..=i16::from(u8::MAX))
            .filter_map(|key| ApiKey::try_from(key).ok())
            .map(|api| (api, api.valid_versions().min, api.valid_versions().max))
            .collect();
        Self::new(&entries)
    }

    /// The range the broker implements for `api`, if any.
    pub fn range(&self, api: ApiKey) -> Option<VersionRange> {
        self.ranges.get(&(api as i16)).map(|(_, r)| *r)
    }

    /// The body of an ApiVersions answer listing every supported API.
    pub fn api_versions_response(&self, error_code: i16) -> ApiVersionsResponse {
        let mut response = ApiVersionsResponse::default();
        response.error_code = error_code;
        response.api_keys = self
            .ranges
            .values()
            .map(|(api, r)| {
                ApiVersion::default().with_api_key(*api as i16).with_min_version(r.min).with_max_version(r.max)
            })
            .collect();
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertises_exactly_the_table() {
        let apis = SupportedApis::new(&[(ApiKey::ApiVersions, 0, 3), (ApiKey::Metadata, 1, 9)]);
        let r = apis.api_versions_response(0);
        let listed: Vec<(i16, i16, i16)> =
            r.api_keys.iter().map(|a| (a.api_key, a.min_version, a.max_version)).collect();
        assert_eq!(listed, vec![(3, 1, 9), (18, 0, 3)]);
        assert!(apis.range(ApiKey::Produce).is_none());
        assert!(apis.range(ApiKey::ApiVersions).unwrap().contains(3));
        assert!(!apis.range(ApiKey::ApiVersions).unwrap().contains(4));
    }

    #[test]
    #[should_panic(expected = "outside what the codec supports")]
    fn a_range_beyond_the_codec_is_a_bug() {
        SupportedApis::new(&[(ApiKey::ApiVersions, 0, 99)]);
    }
}
