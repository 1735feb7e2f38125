//! The admin input kinds, declared once: the list at the bottom of this file is the only place that
//! names every kind. Everything that handles all of them (the configurator's watches and snapshot,
//! folding and hashing a revision's inputs, undecodable reporting, status writes, the plugin, manifests,
//! test fixtures) goes through what the list generates.
//!
//! ```text
//!   input_kinds! { Vrf: VRFRouteConfiguration(VRFRouteConfigurationSpec) in vrfs, … }
//!        │
//!        ├─► InputKind        the kinds as values: names, CRD facts, dispatch to the type
//!        ├─► impl Input for   each kind as a type: its spec, status, place in RevisionInputs
//!        ├─► ByKind<F>        one F::Of<K> per kind (stores, snapshots, cached objects)
//!        ├─► AnyInput         one object of any kind (a manifest document)
//!        └─► each_kind(v)     a visitor called once per kind, in the list's order
//! ```
//!
//! Adding a kind: its type (in `inputs`, with `status = "InputStatus"`), its list in [`RevisionInputs`]
//! (left out when empty, so older revisions keep their hash), its rules (validation, render, CEL) and
//! one line in the list.

use std::borrow::Cow;
use std::fmt::{self, Debug};

use kube::core::{ApiResource, ClusterResourceScope};
use kube::{CustomResourceExt, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::input_status::InputStatus;
use crate::inputs::*;
use crate::rollout::{Named, RevisionInputs};

/// One admin input kind as a type. Implemented by the list below for each input CRD, and by nothing else.
pub trait Input:
    Resource<DynamicType = (), Scope = ClusterResourceScope>
    + CustomResourceExt
    + Clone
    + Debug
    + PartialEq
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// This kind as a value.
    const KIND: InputKind;
    /// What an admin writes (`spec`).
    type Spec: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static;

    fn spec(&self) -> &Self::Spec;
    fn status(&self) -> Option<&InputStatus>;
    fn status_mut(&mut self) -> &mut Option<InputStatus>;
    /// A new object with this name and spec (no status).
    fn with_spec(name: &str, spec: Self::Spec) -> Self;
    /// This kind's objects in a revision's inputs.
    fn named(inputs: &RevisionInputs) -> &Vec<Named<Self::Spec>>;
    fn named_mut(inputs: &mut RevisionInputs) -> &mut Vec<Named<Self::Spec>>;
    /// This kind's entry of a per-kind table.
    fn of<F: Family>(table: &ByKind<F>) -> &F::Of<Self>;
    fn of_mut<F: Family>(table: &mut ByKind<F>) -> &mut F::Of<Self>;
    /// The object, when `any` is one of this kind.
    fn from_any(any: &AnyInput) -> Option<&Self>;
    fn into_any(self) -> AnyInput;
}

/// What a [`ByKind`] holds for each kind: `Of<VRFRouteConfiguration>`, `Of<RoutingTable>`, …
pub trait Family {
    type Of<K: Input>;
}

/// Something done once per kind, with the kind's type in hand ([`each_kind`], [`InputKind::visit`]).
pub trait Visit {
    fn visit<K: Input>(&mut self);
}

/// Makes a [`ByKind`] entry for each kind ([`ByKind::make`]).
pub trait Make<F: Family> {
    fn make<K: Input>(&mut self) -> F::Of<K>;
}

/// [`Family`]: the objects of each kind, shared (`Vec<Arc<K>>`), as a snapshot of the stores holds them.
pub struct Objects;
impl Family for Objects {
    type Of<K: Input> = Vec<std::sync::Arc<K>>;
}

impl<F: Family> ByKind<F> {
    /// One entry per kind, each made by `m`.
    pub fn make(m: &mut impl Make<F>) -> Self {
        ByKind::make_each(m)
    }

    pub fn get<K: Input>(&self) -> &F::Of<K> {
        K::of(self)
    }

    pub fn get_mut<K: Input>(&mut self) -> &mut F::Of<K> {
        K::of_mut(self)
    }
}

/// One object of a [`ByKind<Objects>`], whatever its kind.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub kind: InputKind,
    pub meta: &'a kube::core::ObjectMeta,
    pub status: Option<&'a InputStatus>,
}

impl ByKind<Objects> {
    /// Every object, kind by kind in the list's order.
    pub fn views(&self) -> Vec<View<'_>> {
        struct Views<'a>(&'a ByKind<Objects>, Vec<View<'a>>);
        impl<'a> Visit for Views<'a> {
            fn visit<K: Input>(&mut self) {
                let table: &'a ByKind<Objects> = self.0;
                self.1.extend(table.get::<K>().iter().map(|o| View {
                    kind: K::KIND,
                    meta: o.meta(),
                    status: o.status(),
                }));
            }
        }
        let mut v = Views(self, Vec::new());
        each_kind(&mut v);
        v.1
    }

    /// The object of `kind` named `name`.
    pub fn view(&self, kind: InputKind, name: &str) -> Option<View<'_>> {
        (self.views().into_iter()).find(|v| v.kind == kind && v.meta.name.as_deref() == Some(name))
    }

    /// Adds `o` to its kind's list.
    pub fn push(&mut self, o: AnyInput) {
        struct Push<'a>(&'a mut ByKind<Objects>, Option<AnyInput>);
        impl Visit for Push<'_> {
            fn visit<K: Input>(&mut self) {
                if let Some(o) = self.1.as_ref().and_then(K::from_any) {
                    self.0.get_mut::<K>().push(std::sync::Arc::new(o.clone()));
                }
            }
        }
        let kind = o.kind();
        kind.visit(&mut Push(self, Some(o)));
    }

    /// Sets the status of the object of `kind` named `name`, if there is one.
    pub fn set_status(&mut self, kind: InputKind, name: &str, status: Option<InputStatus>) {
        struct Set<'a>(&'a mut ByKind<Objects>, &'a str, Option<InputStatus>);
        impl Visit for Set<'_> {
            fn visit<K: Input>(&mut self) {
                let name = self.1;
                let named = |o: &&mut std::sync::Arc<K>| o.meta().name.as_deref() == Some(name);
                if let Some(o) = self.0.get_mut::<K>().iter_mut().find(named) {
                    *std::sync::Arc::make_mut(o).status_mut() = self.2.take();
                }
            }
        }
        kind.visit(&mut Set(self, name, status));
    }

    /// Whether both hold the very same objects (by address) in the same order.
    pub fn same_objects(&self, other: &ByKind<Objects>) -> bool {
        struct Same<'a>(&'a ByKind<Objects>, &'a ByKind<Objects>, bool);
        impl Visit for Same<'_> {
            fn visit<K: Input>(&mut self) {
                let (a, b) = (self.0.get::<K>(), self.1.get::<K>());
                self.2 &= a.len() == b.len()
                    && a.iter().zip(b).all(|(x, y)| std::sync::Arc::ptr_eq(x, y));
            }
        }
        let mut s = Same(self, other, true);
        each_kind(&mut s);
        s.2
    }
}

impl InputKind {
    /// The name kubectl knows the kind by: its first CRD short name (`vrf`, `l2`), else its kind in
    /// lower case (`mirrortarget`).
    pub fn short_name(self) -> Cow<'static, str> {
        struct Short(Cow<'static, str>);
        impl Visit for Short {
            fn visit<K: Input>(&mut self) {
                self.0 = match K::shortnames().first() {
                    Some(s) => Cow::Borrowed(s),
                    None => Cow::Owned(K::KIND.as_str().to_lowercase()),
                };
            }
        }
        let mut s = Short(Cow::Borrowed(""));
        self.visit(&mut s);
        s.0
    }

    /// Where the API server serves it (group, version, kind, plural), for untyped requests.
    pub fn api_resource(self) -> ApiResource {
        struct Erase(Option<ApiResource>);
        impl Visit for Erase {
            fn visit<K: Input>(&mut self) {
                self.0 = Some(ApiResource::erase::<K>(&()));
            }
        }
        let mut e = Erase(None);
        self.visit(&mut e);
        e.0.expect("every kind has a type")
    }
}

impl fmt::Display for InputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AnyInput {
    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    /// The object as JSON, as it would be sent to the API server.
    pub fn to_value(&self) -> serde_json::Value {
        struct ToValue<'a>(&'a AnyInput, serde_json::Value);
        impl Visit for ToValue<'_> {
            fn visit<K: Input>(&mut self) {
                if let Some(o) = K::from_any(self.0) {
                    self.1 = serde_json::to_value(o).expect("netwave types always serialize");
                }
            }
        }
        let mut v = ToValue(self, serde_json::Value::Null);
        self.kind().visit(&mut v);
        v.1
    }

    /// The object for untyped requests: `Api::<DynamicObject>::all_with(client, &o.kind().api_resource())`.
    pub fn to_dynamic(&self) -> kube::core::DynamicObject {
        serde_json::from_value(self.to_value()).expect("an object is a DynamicObject")
    }

    /// Decodes `value` as an object of `kind`, refusing fields the type does not know.
    pub fn from_value(kind: InputKind, value: &serde_json::Value) -> Result<Self, String> {
        struct Decode<'a>(&'a serde_json::Value, Option<Result<AnyInput, String>>);
        impl Visit for Decode<'_> {
            fn visit<K: Input>(&mut self) {
                self.1 = Some(crate::strict::typed::<K>(self.0).map(K::into_any));
            }
        }
        let mut d = Decode(value, None);
        kind.visit(&mut d);
        d.1.expect("every kind has a type")
    }

    /// Decodes `value` as an object of `kind` as the API server serves it (fields the type does not
    /// know, from a newer version, are ignored).
    pub fn from_api(kind: InputKind, value: serde_json::Value) -> Result<Self, serde_json::Error> {
        struct Decode(
            Option<serde_json::Value>,
            Option<Result<AnyInput, serde_json::Error>>,
        );
        impl Visit for Decode {
            fn visit<K: Input>(&mut self) {
                let value = self.0.take().unwrap_or_default();
                self.1 = Some(serde_json::from_value::<K>(value).map(K::into_any));
            }
        }
        let mut d = Decode(Some(value), None);
        kind.visit(&mut d);
        d.1.expect("every kind has a type")
    }

    /// Adds the object to `inputs` under its name, as the configurator folds it.
    pub fn add_to(self, inputs: &mut RevisionInputs) {
        struct Add<'a>(Option<AnyInput>, &'a mut RevisionInputs);
        impl Visit for Add<'_> {
            fn visit<K: Input>(&mut self) {
                if let Some(o) = self.0.as_ref().and_then(K::from_any) {
                    let name = o.meta().name.clone().unwrap_or_default();
                    let named = Named::new(name, o.spec().clone());
                    K::named_mut(self.1).push(named);
                }
            }
        }
        let kind = self.kind();
        kind.visit(&mut Add(Some(self), inputs));
    }
}

/// Declares the kinds: `Variant: Type(Spec) in revision_inputs_field`, in the order their lists are
/// serialized in a revision's inputs.
macro_rules! input_kinds {
    ($($variant:ident: $ty:ident($spec:ident) in $field:ident;)*) => {
        /// Kind of an admin input object.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum InputKind {
            $($variant,)*
        }

        impl InputKind {
            /// Every kind, in the list's order.
            pub const ALL: &'static [InputKind] = &[$(InputKind::$variant,)*];

            /// Calls `v` with this kind's type.
            pub fn visit(self, v: &mut impl Visit) {
                match self {
                    $(InputKind::$variant => v.visit::<$ty>(),)*
                }
            }

            /// The Kubernetes kind (`VRFRouteConfiguration`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(InputKind::$variant => stringify!($ty),)*
                }
            }

            /// The kind named `kind` (`VRFRouteConfiguration`), if it is an input kind.
            pub fn from_kind(kind: &str) -> Option<InputKind> {
                match kind {
                    $(stringify!($ty) => Some(InputKind::$variant),)*
                    _ => None,
                }
            }
        }

        /// Calls `v` once per kind, in the list's order.
        pub fn each_kind(v: &mut impl Visit) {
            $(v.visit::<$ty>();)*
        }

        /// One `F::Of<K>` per input kind, named like the lists of [`RevisionInputs`].
        pub struct ByKind<F: Family> {
            $(pub $field: F::Of<$ty>,)*
        }

        impl<F: Family> ByKind<F> {
            fn make_each(m: &mut impl Make<F>) -> Self {
                ByKind { $($field: m.make::<$ty>(),)* }
            }
        }

        impl<F: Family> Clone for ByKind<F>
        where
            $(F::Of<$ty>: Clone,)*
        {
            fn clone(&self) -> Self {
                ByKind { $($field: self.$field.clone(),)* }
            }
        }

        impl<F: Family> Default for ByKind<F>
        where
            $(F::Of<$ty>: Default,)*
        {
            fn default() -> Self {
                ByKind { $($field: Default::default(),)* }
            }
        }

        /// One input object of any kind.
        #[derive(Clone, Debug, PartialEq)]
        pub enum AnyInput {
            $($variant($ty),)*
        }

        impl AnyInput {
            pub fn kind(&self) -> InputKind {
                match self {
                    $(AnyInput::$variant(_) => InputKind::$variant,)*
                }
            }

            pub fn meta(&self) -> &kube::core::ObjectMeta {
                match self {
                    $(AnyInput::$variant(o) => o.meta(),)*
                }
            }
        }

        $(
            impl Input for $ty {
                const KIND: InputKind = InputKind::$variant;
                type Spec = $spec;

                fn spec(&self) -> &$spec {
                    &self.spec
                }
                fn status(&self) -> Option<&InputStatus> {
                    self.status.as_ref()
                }
                fn status_mut(&mut self) -> &mut Option<InputStatus> {
                    &mut self.status
                }
                fn with_spec(name: &str, spec: $spec) -> Self {
                    $ty::new(name, spec)
                }
                fn named(inputs: &RevisionInputs) -> &Vec<Named<$spec>> {
                    &inputs.$field
                }
                fn named_mut(inputs: &mut RevisionInputs) -> &mut Vec<Named<$spec>> {
                    &mut inputs.$field
                }
                fn of<F: Family>(table: &ByKind<F>) -> &F::Of<Self> {
                    &table.$field
                }
                fn of_mut<F: Family>(table: &mut ByKind<F>) -> &mut F::Of<Self> {
                    &mut table.$field
                }
                fn from_any(any: &AnyInput) -> Option<&Self> {
                    match any {
                        AnyInput::$variant(o) => Some(o),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
                fn into_any(self) -> AnyInput {
                    AnyInput::$variant(self)
                }
            }
        )*
    };
}

// The list. Its order is the order of the lists in a revision's serialized inputs (and so its hash).
input_kinds! {
    Vrf: VRFRouteConfiguration(VRFRouteConfigurationSpec) in vrfs;
    Layer2: Layer2NetworkConfiguration(Layer2NetworkConfigurationSpec) in layer2s;
    RoutingTable: RoutingTable(RoutingTableSpec) in routing_tables;
    BgpPeering: BGPPeering(BGPPeeringSpec) in bgp_peerings;
    MirrorTarget: MirrorTarget(MirrorTargetSpec) in mirror_targets;
    MirrorSelector: MirrorSelector(MirrorSelectorSpec) in mirror_selectors;
    Underlay: Underlay(UnderlaySpec) in underlays;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_names_itself_and_its_crd() {
        let mut seen = Vec::new();
        struct Collect<'a>(&'a mut Vec<(InputKind, String)>);
        impl Visit for Collect<'_> {
            fn visit<K: Input>(&mut self) {
                self.0.push((K::KIND, K::kind(&()).into_owned()));
            }
        }
        each_kind(&mut Collect(&mut seen));
        let kinds: Vec<InputKind> = seen.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, InputKind::ALL);
        for (k, name) in &seen {
            assert_eq!(k.as_str(), name, "the list's type name is the CRD's kind");
            assert_eq!(InputKind::from_kind(name), Some(*k));
            assert_eq!(k.api_resource().kind, *name);
        }
        assert_eq!(InputKind::Vrf.short_name(), "vrf");
        assert_eq!(InputKind::MirrorTarget.short_name(), "mirrortarget");
    }

    #[test]
    fn an_object_goes_into_the_inputs_under_its_own_kind() {
        let spec: RoutingTableSpec = serde_json::from_value(serde_json::json!({"tableId": 7}))
            .expect("a routing table spec");
        let mut inputs = RevisionInputs::default();
        RoutingTable::with_spec("t", spec.clone())
            .into_any()
            .add_to(&mut inputs);
        assert_eq!(inputs.routing_tables, vec![Named::new("t", spec)]);
        assert!(inputs.vrfs.is_empty() && inputs.layer2s.is_empty());
    }
}
