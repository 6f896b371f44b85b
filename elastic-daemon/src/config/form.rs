//! The two forms of onepoold.toml's values. The file's types (in
//! [`super::file`]) are defined once, generic over a [`Form`]: a program
//! builds [`Typed`] values and writes them, onepoold reads [`Raw`] ones.
//! Raw values are the file's own text and where it stands (`Spanned`), so
//! that a wrong value is reported at its place, with every other wrong one,
//! instead of failing the whole read at the first.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use onepool_decisions::duration;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use toml::Spanned;

use serde::de::{DeserializeOwned, Error as _};

/// What a file type holds in each key, by the key's kind.
pub trait Form: Clone + Debug + PartialEq {
    type Text: FormValue;
    type Path: FormValue;
    type U32: FormValue;
    type Usize: FormValue;
    type U64: FormValue;
    type Float: FormValue;
    type Bool: FormValue;
    type Duration: FormValue + AsText;
    type Address: FormValue + AsText;
    /// First and last port.
    type Ports: FormValue + AsText;
    type Mode: FormValue + AsText;
    /// `load_metrics`.
    type Metrics: FormValue;
    /// A table; [`Raw`] keeps where it stands, for the errors that concern
    /// the whole table.
    type Table<T: FormValue>: FormValue;
}

/// What a form's values need: to be compared, shown, written and read.
pub trait FormValue: Clone + Debug + PartialEq + Serialize + DeserializeOwned {}

impl<T: Clone + Debug + PartialEq + Serialize + DeserializeOwned> FormValue for T {}

/// Values as a program builds them. Reading this form is strict: the first
/// value of the wrong syntax fails the read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Typed;

/// Values as onepoold reads them: each as the file wrote it (numbers as
/// TOML's integers, durations and addresses as their text), with where.
/// A value is checked after the read ([`super::parse`]), never by it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Raw;

impl Form for Typed {
    type Text = String;
    type Path = PathBuf;
    type U32 = u32;
    type Usize = usize;
    type U64 = u64;
    type Float = f64;
    type Bool = bool;
    type Duration = Duration;
    type Address = SocketAddr;
    type Ports = (u16, u16);
    type Mode = Mode;
    /// Names only: `"auto"` is for files written by hand.
    type Metrics = Vec<String>;
    type Table<T: FormValue> = T;
}

impl Form for Raw {
    type Text = Spanned<String>;
    type Path = Spanned<String>;
    type U32 = Spanned<i64>;
    type Usize = Spanned<i64>;
    type U64 = Spanned<i64>;
    type Float = Spanned<f64>;
    type Bool = Spanned<bool>;
    type Duration = Spanned<String>;
    type Address = Spanned<String>;
    type Ports = Spanned<String>;
    type Mode = Spanned<String>;
    /// Read as any value, so that a wrong type gets the key's own message.
    type Metrics = Spanned<toml::Value>;
    type Table<T: FormValue> = Spanned<T>;
}

/// A file mode, written in octal ("0600"). Its serde derives are there for
/// [`FormValue`]; the file writes and reads it [`AsText`], as a duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mode(pub u32);

/// A value the file holds as a string in a syntax of its own: "30s",
/// "127.0.0.1:8000", "18000-18999", "0600". Raw ones are that string.
pub trait AsText: Sized {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

/// `#[serde(with = "as_text")]` for the keys of an [`AsText`] kind.
pub(super) mod as_text {
    use serde::{Deserializer, Serializer};

    use crate::config::form::AsText;

    pub fn serialize<T: AsText, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        v.write(s)
    }

    pub fn deserialize<'de, T: AsText, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        T::read(d)
    }
}

impl<T: AsText> AsText for Option<T> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Some(v) => v.write(s),
            // The TOML writer leaves the key out.
            None => s.serialize_none(),
        }
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::read(d).map(Some)
    }
}

impl AsText for Spanned<String> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.serialize(s)
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Spanned::deserialize(d)
    }
}

/// Reads a string with `parse`, its error the message.
fn read_text<'de, D: Deserializer<'de>, T>(d: D, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<T, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(D::Error::custom)
}

/// Whole milliseconds at the finest.
impl AsText for Duration {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&duration::format_millis(*self))
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        read_text(d, duration::parse_millis)
    }
}

impl AsText for SocketAddr {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        read_text(d, |t| t.parse().map_err(|_| format!("{t:?} is not an IP address with a port")))
    }
}

impl AsText for (u16, u16) {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{}-{}", self.0, self.1))
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        read_text(d, |t| parse_ports(t).ok_or_else(|| format!("{t:?} is not FIRST-LAST")))
    }
}

impl AsText for Mode {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:04o}", self.0))
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        read_text(d, |t| u32::from_str_radix(t, 8).map(Mode).map_err(|_| format!("{t:?} is not an octal mode")))
    }
}

/// "FIRST-LAST", FIRST above zero and below LAST.
pub(super) fn parse_ports(text: &str) -> Option<(u16, u16)> {
    let (a, b) = text.split_once('-')?;
    let (a, b) = (a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?);
    (a > 0 && a < b).then_some((a, b))
}
