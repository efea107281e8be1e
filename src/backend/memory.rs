//! The `memory` backend (tests only): a registry of sandboxes whose HTTP
//! server is a real upstream named by `MEMORY_SANDBOX_URL_TEMPLATE`.
