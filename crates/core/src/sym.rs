//! Names and hashes the rollout compares many times per step (#28): revision names, config hashes,
//! node names. A [`Sym`] is a shared immutable string whose equality is decided without reading the
//! text when it can be: two copies of one string are equal, and two strings of one [`Interner`] are
//! equal exactly when they are the same copy (it holds one copy of each text). The configurator
//! interns each string once, when it converts an object that changed; everything else (tests, the
//! simulator, the plugin) may build them from plain strings and still gets the same answers, only
//! without the shortcut.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};

/// A shared string: equal, ordered and hashed by its content, with shortcuts for equality.
#[derive(Clone)]
pub struct Sym {
    text: Arc<str>,
    /// The [`Interner`] that holds this copy (0: none).
    interner: u32,
}

impl Sym {
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Both are the same allocation (so certainly equal).
    pub fn same(&self, other: &Sym) -> bool {
        Arc::ptr_eq(&self.text, &other.text)
    }
}

impl Default for Sym {
    fn default() -> Self {
        Sym::from("")
    }
}

impl PartialEq for Sym {
    fn eq(&self, other: &Sym) -> bool {
        if self.same(other) {
            return true;
        }
        // One interner holds one copy of each text: two different copies of it differ.
        if self.interner != 0 && self.interner == other.interner {
            return false;
        }
        *self.text == *other.text
    }
}

impl Eq for Sym {}

impl PartialOrd for Sym {
    fn partial_cmp(&self, other: &Sym) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Sym {
    fn cmp(&self, other: &Sym) -> Ordering {
        if self.same(other) {
            Ordering::Equal
        } else {
            self.text.cmp(&other.text)
        }
    }
}

/// Hashes as the `str` it holds, so a `HashSet<Sym>` is searched with a `&str` ([`Borrow`]).
impl Hash for Sym {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Borrow<str> for Sym {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl Deref for Sym {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl AsRef<str> for Sym {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.text, f)
    }
}

impl fmt::Debug for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

impl From<&str> for Sym {
    fn from(s: &str) -> Sym {
        Sym {
            text: Arc::from(s),
            interner: 0,
        }
    }
}

impl From<String> for Sym {
    fn from(s: String) -> Sym {
        Sym {
            text: Arc::from(s),
            interner: 0,
        }
    }
}

impl From<&String> for Sym {
    fn from(s: &String) -> Sym {
        Sym::from(s.as_str())
    }
}

impl From<&Sym> for Sym {
    fn from(s: &Sym) -> Sym {
        s.clone()
    }
}

impl From<Sym> for String {
    fn from(s: Sym) -> String {
        s.as_str().to_string()
    }
}

impl PartialEq<str> for Sym {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Sym {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Sym {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Sym> for str {
    fn eq(&self, other: &Sym) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Sym> for &str {
    fn eq(&self, other: &Sym) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Sym> for String {
    fn eq(&self, other: &Sym) -> bool {
        self.as_str() == other.as_str()
    }
}

/// One copy of each string: equal strings interned here are the same [`Sym`], so they compare by
/// pointer, and different ones without reading them. Strings nobody else holds any more are dropped
/// once the set has doubled since the last sweep (so no other copy of their text exists), and a
/// long-lived interner stays the size of what is in use.
pub struct Interner {
    set: HashSet<Sym>,
    /// Size after the last sweep.
    kept: usize,
    id: u32,
}

/// Interner ids; 0 is "not interned".
static NEXT_INTERNER: AtomicU32 = AtomicU32::new(1);

impl Default for Interner {
    fn default() -> Self {
        Interner {
            set: HashSet::new(),
            kept: 0,
            id: NEXT_INTERNER.fetch_add(1, AtomicOrdering::Relaxed).max(1),
        }
    }
}

/// Below this many strings the interner never sweeps.
const SWEEP_FLOOR: usize = 4096;

impl Interner {
    pub fn intern(&mut self, s: &str) -> Sym {
        if let Some(sym) = self.set.get(s) {
            return sym.clone();
        }
        if self.set.len() >= (2 * self.kept).max(SWEEP_FLOOR) {
            self.set.retain(|sym| Arc::strong_count(&sym.text) > 1);
            self.kept = self.set.len();
        }
        let sym = Sym {
            text: Arc::from(s),
            interner: self.id,
        };
        self.set.insert(sym.clone());
        sym
    }

    pub fn intern_opt(&mut self, s: Option<&str>) -> Option<Sym> {
        s.map(|s| self.intern(s))
    }

    /// Strings held.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interned_copies_are_one_allocation_and_plain_ones_still_compare_by_content() {
        let mut i = Interner::default();
        let a = i.intern("rev-1");
        let b = i.intern(&String::from("rev-1"));
        assert!(a.same(&b));
        let plain = Sym::from("rev-1");
        assert!(!a.same(&plain));
        assert_eq!(a, plain);
        assert_eq!(a.cmp(&Sym::from("rev-2")), Ordering::Less);
        assert_eq!(a, "rev-1");
        let c = i.intern("rev-2");
        assert_ne!(a, c);
        assert_eq!(c, Sym::from("rev-2"));
        // Another interner's copy is equal by its text.
        assert_eq!(Interner::default().intern("rev-2"), c);
    }

    #[test]
    fn strings_nobody_holds_are_swept_once_the_set_doubles() {
        let mut i = Interner::default();
        let kept: Vec<Sym> = (0..10).map(|n| i.intern(&format!("kept-{n}"))).collect();
        for n in 0..SWEEP_FLOOR * 3 {
            i.intern(&format!("gone-{n}"));
        }
        assert!(i.len() <= SWEEP_FLOOR * 2, "{} strings held", i.len());
        for (n, k) in kept.iter().enumerate() {
            assert!(i.intern(&format!("kept-{n}")).same(k));
        }
    }
}
