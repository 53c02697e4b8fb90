//! One module per provider protocol the mock speaks, listed once (the
//! `protocols!` line below): a new provider's mock is one module and its
//! name there (and, if it keeps state of its own, its `Protocol` in the
//! mock's `Inner`).

use axum::Router;

use crate::mock_provider::MockProvider;

/// Adds one protocol's routes to the mock's router.
pub type AddRoutes = fn(Router<MockProvider>) -> Router<MockProvider>;

macro_rules! protocols {
    ($($name:ident),+ $(,)?) => {
        $(pub mod $name;)+

        /// Every protocol's routes.
        pub const ROUTES: &[AddRoutes] = &[$($name::routes),+];
    };
}

protocols!(http, twilio);

/// `router` with every protocol's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    ROUTES.iter().fold(router, |r, add| add(r))
}
