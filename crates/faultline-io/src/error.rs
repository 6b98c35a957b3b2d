//! The errors of the I/O API: one enum, each variant named after what
//! failed, keeping its cause.

/// Errors of the I/O API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The buffer leaves the region.
    #[error("buffer [{offset}, +{len}) is outside the region of {region_len} bytes")]
    OutOfRange {
        /// Region offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Region length.
        region_len: usize,
    },
    /// Not supported here, and why.
    #[error("{what} is not supported: {reason}")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
        /// Why not.
        reason: String,
    },
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// The step that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Resolving pages failed.
    #[error("resolving region pages: {0}")]
    Resolve(#[source] faultline::Error),
}

/// Result of the I/O API.
pub type Result<T, E = Error> = std::result::Result<T, E>;
