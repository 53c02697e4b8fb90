//! Route quality at work (issue 43): on its beat each instance reads the
//! stored orders, measures every route from the database, and writes the
//! order [`quality::decide`] asks for (compare-and-set, with its audit row);
//! `GET /routes`, the console and pins go through here too. Nothing here
//! is on a send's path: a send reads the copy in [`RouteOrders`].

use std::sync::Arc;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Deliverer;
use super::destinations::Route;
use super::orders::RouteOrders;
use super::quality::QualitySettings;
use super::quality::{self, Current, Measured, Verdict};
use crate::admin::{Actor, AuditEntry};
use crate::clock::Clock;
use crate::store::{QualityWindow, RouteOrder, Store, StoreError};

/// One provider of a route, as reported.
#[derive(Clone, Debug)]
pub struct ProviderReport {
    pub name: String,
    pub measured: Measured,
    pub verdict: Verdict,
}

/// One route, as reported.
#[derive(Clone, Debug)]
pub struct RouteReport {
    pub prefix: String,
    pub configured: Vec<String>,
    /// In their current order.
    pub providers: Vec<ProviderReport>,
    pub pinned: bool,
    /// Why the order is what it is, and since when (`None`: configured).
    pub reason: Option<String>,
    pub changed_at: Option<OffsetDateTime>,
}

/// Everything `GET /routes` and the console show.
#[derive(Clone, Debug)]
pub struct Report {
    pub on: bool,
    pub window: std::time::Duration,
    pub slow_after: std::time::Duration,
    pub at: OffsetDateTime,
    pub routes: Vec<RouteReport>,
    /// Channels of their own (and unrouted SMS) with codes: conversion by
    /// provider.
    pub channels: Vec<Measured>,
}

/// Why a pin was refused.
#[derive(Debug)]
pub enum PinError {
    NoRoute,
    /// The list is not the route's providers, each once.
    NotTheRoutes(Vec<String>),
    Store(StoreError),
    /// Other writers kept coming first.
    Busy,
}

impl From<StoreError> for PinError {
    fn from(e: StoreError) -> Self {
        PinError::Store(e)
    }
}

pub struct RouteQuality {
    pub store: Arc<dyn Store>,
    pub deliverer: Arc<Deliverer>,
    pub orders: Arc<RouteOrders>,
    pub clock: Clock,
    pub settings: QualitySettings,
}

fn quality_actor() -> Actor {
    Actor {
        via: "quality",
        key_id: None,
        key_label: None,
        scopes: crate::scopes::Scopes::ALL,
        tenant_id: None,
    }
}

fn entry(
    actor: &Actor,
    at: OffsetDateTime,
    action: &'static str,
    prefix: &str,
    detail: serde_json::Value,
) -> AuditEntry {
    AuditEntry {
        id: Uuid::now_v7(),
        at,
        actor: actor.clone(),
        action,
        target: format!("route {prefix}"),
        detail,
    }
}

impl RouteQuality {
    fn routes(&self) -> Vec<Route> {
        self.deliverer
            .routes()
            .map(|r| r.entries().to_vec())
            .unwrap_or_default()
    }

    fn window(&self, now: OffsetDateTime) -> QualityWindow {
        let t = &self.settings.thresholds;
        QualityWindow {
            since: now - self.settings.window,
            judged_before: now - t.slow_after,
            slow_after_micros: i64::try_from(t.slow_after.as_micros()).unwrap_or(i64::MAX),
        }
    }

    /// One beat: the stored orders read into this instance's copy, then,
    /// with quality on, every route of two or more providers measured and
    /// its new order written when [`quality::decide`] asks for one. The
    /// orders this instance changed.
    pub async fn evaluate(&self) -> Result<Vec<RouteOrder>, StoreError> {
        let stored = self.store.route_orders().await?;
        self.orders.replace(stored.clone());
        // Nothing to decide: no aggregate over the window at all.
        if !self.settings.on || !self.routes().iter().any(|r| r.providers.len() >= 2) {
            return Ok(Vec::new());
        }
        let now = self.clock.now();
        let measured = self.store.route_quality(self.window(now)).await?;
        self.export(&measured);
        let mut changed = Vec::new();
        for route in self.routes().iter().filter(|r| r.providers.len() >= 2) {
            let row = stored.iter().find(|o| o.prefix == route.prefix);
            let current = Current {
                providers: quality::effective(
                    &route.providers,
                    row.map(|o| o.providers.as_slice()),
                ),
                pinned: row.is_some_and(|o| o.pinned),
                changed_at: row.map(|o| o.changed_at),
            };
            let of_route: Vec<Measured> = measured
                .iter()
                .filter(|m| m.route == route.prefix)
                .cloned()
                .collect();
            let Some(change) = quality::decide(
                &route.providers,
                &current,
                &of_route,
                &self.settings.thresholds,
                now,
            ) else {
                continue;
            };
            let order = RouteOrder {
                prefix: route.prefix.clone(),
                providers: change.providers.clone(),
                pinned: false,
                reason: change.reason.clone(),
                changed_at: now,
                version: row.map_or(1, |o| o.version + 1),
            };
            let audit = entry(
                &quality_actor(),
                now,
                "route.shift",
                &route.prefix,
                serde_json::json!({
                    "from": current.providers,
                    "to": change.providers,
                    "reason": change.reason,
                }),
            );
            if self.store.put_route_order(&order, &audit).await? {
                tracing::warn!(
                    route = %route.prefix,
                    from = %current.providers.join(","),
                    to = %order.providers.join(","),
                    reason = %order.reason,
                    "route order changed by measured quality"
                );
                self.deliverer.metrics().route_order_change(&route.prefix);
                self.orders.remember(order.clone());
                changed.push(order);
            }
        }
        self.export_positions();
        Ok(changed)
    }

    /// The gauges of every measured route and provider.
    fn export(&self, measured: &[Measured]) {
        let metrics = self.deliverer.metrics();
        for m in measured {
            metrics.route_quality(&m.route, &m.provider, m);
        }
    }

    fn export_positions(&self) {
        let metrics = self.deliverer.metrics();
        for route in self.routes() {
            for (i, p) in self.orders.current(&route).iter().enumerate() {
                metrics.route_position(&route.prefix, p, i + 1);
            }
        }
    }

    /// Evaluates on every beat until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            if let Err(e) = self.evaluate().await {
                tracing::warn!(error = %e, "could not measure the routes' quality");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.settings.every) => {}
            }
        }
    }

    /// The routes, their order and quality, measured now.
    pub async fn report(&self) -> Result<Report, StoreError> {
        let now = self.clock.now();
        let stored = self.store.route_orders().await?;
        let measured = self.store.route_quality(self.window(now)).await?;
        let t = &self.settings.thresholds;
        let routes = self
            .routes()
            .into_iter()
            .map(|route| {
                let row = stored
                    .iter()
                    .find(|o| o.prefix == route.prefix)
                    .filter(|o| o.pinned || self.settings.on);
                let order =
                    quality::effective(&route.providers, row.map(|o| o.providers.as_slice()));
                let of = |name: &str| {
                    measured
                        .iter()
                        .find(|m| m.route == route.prefix && m.provider == name)
                        .cloned()
                        .unwrap_or_else(|| Measured {
                            route: route.prefix.clone(),
                            provider: name.to_string(),
                            ..Measured::default()
                        })
                };
                let all: Vec<Measured> = order.iter().map(|n| of(n)).collect();
                let providers = order
                    .iter()
                    .enumerate()
                    .map(|(i, name)| {
                        let others: Vec<&Measured> =
                            all.iter().filter(|m| &m.provider != name).collect();
                        let configured_at = route.providers.iter().position(|p| p == name);
                        let demoted = configured_at.is_some_and(|c| i > c);
                        ProviderReport {
                            name: name.clone(),
                            measured: all[i].clone(),
                            verdict: quality::verdict(&all[i], &others, t, demoted),
                        }
                    })
                    .collect();
                RouteReport {
                    prefix: route.prefix.clone(),
                    configured: route.providers.iter().map(|s| s.to_string()).collect(),
                    providers,
                    pinned: row.is_some_and(|o| o.pinned),
                    reason: row.map(|o| o.reason.clone()),
                    changed_at: row.map(|o| o.changed_at),
                }
            })
            .collect();
        Ok(Report {
            on: self.settings.on,
            window: self.settings.window,
            slow_after: t.slow_after,
            at: now,
            routes,
            channels: measured
                .into_iter()
                .filter(|m| m.route.is_empty())
                .collect(),
        })
    }

    /// Pins route `prefix` to `providers` (the route's, each once).
    pub async fn pin(
        &self,
        actor: &Actor,
        prefix: &str,
        providers: Vec<String>,
    ) -> Result<(), PinError> {
        let Some(route) = self.routes().into_iter().find(|r| r.prefix == prefix) else {
            return Err(PinError::NoRoute);
        };
        let mut sorted = providers.clone();
        sorted.sort();
        let mut want: Vec<String> = route.providers.iter().map(|s| s.to_string()).collect();
        want.sort();
        if sorted != want {
            return Err(PinError::NotTheRoutes(
                route.providers.iter().map(|s| s.to_string()).collect(),
            ));
        }
        for _ in 0..5 {
            let stored = self.store.route_orders().await?;
            let row = stored.iter().find(|o| o.prefix == prefix);
            let now = self.clock.now();
            let order = RouteOrder {
                prefix: prefix.to_string(),
                providers: providers.clone(),
                pinned: true,
                reason: "pinned by an operator".to_string(),
                changed_at: now,
                version: row.map_or(1, |o| o.version + 1),
            };
            let audit = entry(
                actor,
                now,
                "route.pin",
                prefix,
                serde_json::json!({
                    "from": quality::effective(&route.providers, row.map(|o| o.providers.as_slice())),
                    "to": providers,
                }),
            );
            if self.store.put_route_order(&order, &audit).await? {
                self.orders.remember(order);
                return Ok(());
            }
        }
        Err(PinError::Busy)
    }

    /// Unpins route `prefix`: its configured order, for quality to decide
    /// again on its next beat. `Ok(false)`: it was not pinned (nothing
    /// changed, nothing audited).
    pub async fn unpin(&self, actor: &Actor, prefix: &str) -> Result<bool, PinError> {
        if !self.routes().iter().any(|r| r.prefix == prefix) {
            return Err(PinError::NoRoute);
        }
        for _ in 0..5 {
            let stored = self.store.route_orders().await?;
            let Some(row) = stored.iter().find(|o| o.prefix == prefix && o.pinned) else {
                return Ok(false);
            };
            let audit = entry(
                actor,
                self.clock.now(),
                "route.unpin",
                prefix,
                serde_json::json!({ "from": row.providers }),
            );
            if self
                .store
                .delete_route_order(prefix, row.version, &audit)
                .await?
            {
                self.orders.forget(prefix);
                return Ok(true);
            }
        }
        Err(PinError::Busy)
    }
}
