//! OCI images as sandbox root filesystems.
//!
//! * [`unpack`] — applies one uncompressed layer (a tar stream) onto a rootfs
//!   directory held by fd, treating every byte as hostile.

pub mod unpack;
