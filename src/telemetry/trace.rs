//! A push as one trace (see the next commit).
