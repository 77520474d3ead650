//! Units and exact integer amounts.

use serde::{Deserialize, Serialize};

use crate::Rejection;

/// The unit an amount is measured in. One reservation lifecycle uses exactly one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Unit {
    UsdMicrocents,
    Tokens,
    Credits,
    RiskPoints,
}

impl Unit {
    pub const ALL: [Unit; 4] = [
        Unit::UsdMicrocents,
        Unit::Tokens,
        Unit::Credits,
        Unit::RiskPoints,
    ];

    /// The protocol name of the unit (also used in messages).
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::UsdMicrocents => "USD_MICROCENTS",
            Unit::Tokens => "TOKENS",
            Unit::Credits => "CREDITS",
            Unit::RiskPoints => "RISK_POINTS",
        }
    }

    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.as_str() == s)
    }
}

/// An amount in a unit. `amount` is an exact int64; negative only where a balance may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    pub unit: Unit,
    pub amount: i64,
}

impl Amount {
    pub fn new(unit: Unit, amount: i64) -> Self {
        Amount { unit, amount }
    }
}

/// Checked addition: an overflow is a rejection, never a wrap.
pub fn checked_add(a: i64, b: i64) -> Result<i64, Rejection> {
    a.checked_add(b).ok_or(Rejection::Overflow)
}

/// Checked subtraction: an overflow is a rejection, never a wrap.
pub fn checked_sub(a: i64, b: i64) -> Result<i64, Rejection> {
    a.checked_sub(b).ok_or(Rejection::Overflow)
}
