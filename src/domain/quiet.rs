//! Quiet hours in the recipient's local time (issue 15), without I/O.
//!
//! - [`QuietHours`]: a tenant's daily window, `21:00-08:00` (may wrap
//!   midnight), in the recipient's wall-clock time.
//! - [`zones_for`]: the IANA zones a number may be in. Countries map to
//!   their zones; in the North American Numbering Plan the area code
//!   decides the zone for the US and Canada. Offsets and DST rules come from
//!   the tz database (`chrono-tz`), never from this file.
//! - [`release_at`]: the earliest instant at or after a time when it is not
//!   quiet in **any** of the number's zones. So for a number whose region
//!   the numbering plan does not tell (a US area code not in the table, a
//!   Russian or Australian mobile), the message waits until it is outside
//!   the window everywhere in that country: nobody is woken. When a
//!   country's zones leave no common waking time (a long window over a very
//!   wide country), the first zone listed (the capital's) decides.
//!
//! A number whose country is not in the table gets no quiet hours rather
//! than a guessed zone (docs/api.md, "Batches, schedules and quiet hours").

use chrono::{NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Timelike};
use chrono_tz::Tz;
use time::OffsetDateTime;

/// A daily window of local wall-clock time, in minutes after midnight;
/// `start` is inside, `end` is not. `start > end` wraps midnight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuietHours {
    pub start: u16,
    pub end: u16,
}

impl QuietHours {
    /// `HH:MM-HH:MM` (24-hour clock); the two ends must differ.
    pub fn parse(s: &str) -> Option<Self> {
        let (a, b) = s.trim().split_once('-')?;
        let minute = |t: &str| -> Option<u16> {
            let (h, m) = t.trim().split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
            (h < 24 && m < 60).then_some(h * 60 + m)
        };
        let (start, end) = (minute(a)?, minute(b)?);
        (start != end).then_some(Self { start, end })
    }

    fn contains(&self, minute: u16) -> bool {
        if self.start < self.end {
            self.start <= minute && minute < self.end
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

impl std::fmt::Display for QuietHours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:02}:{:02}-{:02}:{:02}",
            self.start / 60,
            self.start % 60,
            self.end / 60,
            self.end % 60
        )
    }
}

fn to_chrono(t: OffsetDateTime) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(t.unix_timestamp(), t.nanosecond())
}

fn from_chrono<T: TimeZone>(t: &chrono::DateTime<T>) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(t.timestamp()).ok()
}

/// The first instant at or after local `at` on `date` that exists in `tz`
/// (a window ending inside a spring-forward gap ends when the gap does).
fn local_instant(tz: Tz, date: NaiveDate, minute: u16) -> Option<OffsetDateTime> {
    let time = NaiveTime::from_hms_opt(u32::from(minute / 60), u32::from(minute % 60), 0)?;
    let mut local = NaiveDateTime::new(date, time);
    for _ in 0..=180 {
        if let Some(t) = tz.from_local_datetime(&local).earliest() {
            return from_chrono(&t);
        }
        local += chrono::Duration::minutes(1);
    }
    None
}

/// When the window that `at` is in ends in `tz`; `None` when `at` is not
/// quiet there.
fn quiet_end(q: &QuietHours, tz: Tz, at: OffsetDateTime) -> Option<OffsetDateTime> {
    let local = to_chrono(at)?.with_timezone(&tz);
    let minute = u16::try_from(local.hour() * 60 + local.minute()).ok()?;
    if !q.contains(minute) {
        return None;
    }
    let date = local.date_naive();
    let end_date = if q.start > q.end && minute >= q.start {
        date.succ_opt()?
    } else {
        date
    };
    local_instant(tz, end_date, q.end).filter(|end| *end > at)
}

/// The earliest instant at or after `at` that is outside the window in every
/// one of `zones` (see the module docs for the rule).
pub fn release_at(q: &QuietHours, zones: &[Tz], at: OffsetDateTime) -> OffsetDateTime {
    let mut t = at;
    for _ in 0..(2 * zones.len() + 2) {
        let mut moved = false;
        for tz in zones {
            if let Some(end) = quiet_end(q, *tz, t) {
                t = end;
                moved = true;
            }
        }
        if !moved {
            return t;
        }
    }
    zones
        .first()
        .and_then(|tz| quiet_end(q, *tz, at))
        .unwrap_or(at)
}

/// The zones a number (E.164, with its ISO region) may be in; empty when
/// its country is not in the table.
pub fn zones_for(e164: &str, region: Option<&str>) -> Vec<Tz> {
    use chrono_tz::America as am;
    use chrono_tz::Asia as asia;
    use chrono_tz::Australia as au;
    use chrono_tz::Europe as eu;
    let Some(region) = region else {
        return Vec::new();
    };
    let area = e164
        .strip_prefix("+1")
        .and_then(|n| n.get(..3))
        .and_then(|a| a.parse::<u16>().ok());
    match region {
        "US" | "CA" => {
            if let Some(tz) = area.and_then(nanp_zone) {
                return vec![tz];
            }
            if region == "US" {
                vec![
                    am::New_York,
                    am::Chicago,
                    am::Denver,
                    am::Phoenix,
                    am::Los_Angeles,
                    am::Anchorage,
                    chrono_tz::Pacific::Honolulu,
                ]
            } else {
                vec![
                    am::Toronto,
                    am::St_Johns,
                    am::Halifax,
                    am::Winnipeg,
                    am::Regina,
                    am::Edmonton,
                    am::Vancouver,
                ]
            }
        }
        "RU" => vec![
            eu::Moscow,
            eu::Kaliningrad,
            eu::Samara,
            asia::Yekaterinburg,
            asia::Omsk,
            asia::Novosibirsk,
            asia::Krasnoyarsk,
            asia::Irkutsk,
            asia::Yakutsk,
            asia::Vladivostok,
            asia::Magadan,
            asia::Kamchatka,
        ],
        "AU" => vec![
            au::Sydney,
            au::Brisbane,
            au::Adelaide,
            au::Darwin,
            au::Perth,
        ],
        "BR" => vec![am::Sao_Paulo, am::Noronha, am::Manaus, am::Rio_Branco],
        "MX" => vec![am::Mexico_City, am::Cancun, am::Hermosillo, am::Tijuana],
        "ID" => vec![asia::Jakarta, asia::Makassar, asia::Jayapura],
        "KZ" => vec![asia::Almaty, asia::Aqtobe],
        "CL" => vec![am::Santiago, chrono_tz::Pacific::Easter],
        "ES" => vec![eu::Madrid, chrono_tz::Atlantic::Canary],
        "PT" => vec![eu::Lisbon, chrono_tz::Atlantic::Azores],
        "NZ" => vec![chrono_tz::Pacific::Auckland],
        other => single_zone(other).into_iter().collect(),
    }
}

/// Countries with one zone (the common destinations).
fn single_zone(region: &str) -> Option<Tz> {
    use chrono_tz::Africa as af;
    use chrono_tz::America as am;
    use chrono_tz::Asia as asia;
    use chrono_tz::Europe as eu;
    Some(match region {
        "GB" => eu::London,
        "IE" => eu::Dublin,
        "FR" => eu::Paris,
        "DE" => eu::Berlin,
        "IT" => eu::Rome,
        "NL" => eu::Amsterdam,
        "BE" => eu::Brussels,
        "LU" => eu::Luxembourg,
        "CH" => eu::Zurich,
        "AT" => eu::Vienna,
        "DK" => eu::Copenhagen,
        "NO" => eu::Oslo,
        "SE" => eu::Stockholm,
        "FI" => eu::Helsinki,
        "PL" => eu::Warsaw,
        "CZ" => eu::Prague,
        "SK" => eu::Bratislava,
        "HU" => eu::Budapest,
        "RO" => eu::Bucharest,
        "BG" => eu::Sofia,
        "GR" => eu::Athens,
        "HR" => eu::Zagreb,
        "SI" => eu::Ljubljana,
        "RS" => eu::Belgrade,
        "EE" => eu::Tallinn,
        "LV" => eu::Riga,
        "LT" => eu::Vilnius,
        "UA" => eu::Kyiv,
        "TR" => eu::Istanbul,
        "IL" => asia::Jerusalem,
        "AE" => asia::Dubai,
        "SA" => asia::Riyadh,
        "QA" => asia::Qatar,
        "IN" => asia::Kolkata,
        "PK" => asia::Karachi,
        "BD" => asia::Dhaka,
        "CN" => asia::Shanghai,
        "HK" => asia::Hong_Kong,
        "TW" => asia::Taipei,
        "JP" => asia::Tokyo,
        "KR" => asia::Seoul,
        "SG" => asia::Singapore,
        "MY" => asia::Kuala_Lumpur,
        "TH" => asia::Bangkok,
        "VN" => asia::Ho_Chi_Minh,
        "PH" => asia::Manila,
        "ZA" => af::Johannesburg,
        "NG" => af::Lagos,
        "KE" => af::Nairobi,
        "EG" => af::Cairo,
        "MA" => af::Casablanca,
        "AR" => am::Argentina::Buenos_Aires,
        "CO" => am::Bogota,
        "PE" => am::Lima,
        "PR" => am::Puerto_Rico,
        "JM" => am::Jamaica,
        _ => return None,
    })
}

/// The zone of a US or Canadian area code whose whole area is in one zone
/// (area codes split between zones are left out: the country rule applies).
fn nanp_zone(area: u16) -> Option<Tz> {
    use chrono_tz::America as am;
    Some(match area {
        // Eastern (US)
        201 | 202 | 203 | 207 | 212 | 215 | 216 | 220 | 223 | 229 | 231 | 234 | 239 | 240 | 248
        | 252 | 267 | 269 | 272 | 276 | 301 | 302 | 304 | 305 | 313 | 315 | 321 | 330 | 332
        | 336 | 339 | 347 | 351 | 352 | 380 | 386 | 401 | 404 | 407 | 410 | 412 | 413 | 419
        | 434 | 440 | 443 | 445 | 470 | 475 | 478 | 484 | 508 | 513 | 516 | 517 | 518 | 540
        | 551 | 561 | 567 | 570 | 571 | 585 | 586 | 603 | 607 | 609 | 610 | 614 | 617 | 631
        | 646 | 667 | 678 | 681 | 703 | 704 | 706 | 716 | 717 | 718 | 724 | 727 | 732 | 734
        | 740 | 754 | 757 | 762 | 770 | 772 | 774 | 781 | 786 | 802 | 803 | 804 | 810 | 813
        | 814 | 828 | 843 | 845 | 848 | 856 | 857 | 860 | 862 | 863 | 864 | 878 | 904 | 908
        | 910 | 912 | 914 | 917 | 919 | 929 | 934 | 937 | 941 | 954 | 959 | 973 | 978 | 980
        | 984 | 989 => am::New_York,
        // Eastern (Canada)
        226 | 249 | 289 | 343 | 365 | 416 | 418 | 437 | 438 | 450 | 514 | 519 | 579 | 581 | 613
        | 647 | 705 | 819 | 873 | 905 => am::Toronto,
        // Central
        205 | 210 | 214 | 217 | 218 | 224 | 225 | 251 | 254 | 256 | 262 | 281 | 309 | 312 | 314
        | 318 | 319 | 320 | 331 | 334 | 337 | 346 | 361 | 405 | 409 | 414 | 417 | 430 | 469
        | 479 | 501 | 504 | 507 | 512 | 515 | 563 | 573 | 580 | 601 | 608 | 612 | 615 | 618
        | 629 | 630 | 636 | 641 | 651 | 662 | 682 | 708 | 712 | 713 | 715 | 737 | 763 | 769
        | 773 | 779 | 815 | 816 | 817 | 830 | 832 | 847 | 870 | 872 | 901 | 903 | 918 | 920
        | 936 | 940 | 952 | 956 | 972 | 979 | 985 => am::Chicago,
        204 | 431 => am::Winnipeg,
        306 | 639 => am::Regina,
        // Mountain
        303 | 307 | 385 | 406 | 435 | 505 | 575 | 719 | 720 | 801 | 915 | 970 => am::Denver,
        403 | 587 | 780 | 825 => am::Edmonton,
        480 | 520 | 602 | 623 | 928 => am::Phoenix,
        // Pacific
        206 | 209 | 213 | 253 | 310 | 323 | 360 | 408 | 415 | 424 | 425 | 442 | 503 | 509 | 510
        | 530 | 559 | 562 | 619 | 626 | 628 | 650 | 657 | 661 | 669 | 702 | 707 | 714 | 725
        | 747 | 760 | 775 | 805 | 818 | 831 | 858 | 909 | 916 | 925 | 949 | 951 | 971 => {
            am::Los_Angeles
        }
        236 | 250 | 604 | 672 | 778 => am::Vancouver,
        907 => am::Anchorage,
        808 => chrono_tz::Pacific::Honolulu,
        506 => am::Moncton,
        782 | 902 => am::Halifax,
        709 => am::St_Johns,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn windows_parse_and_print() {
        #[rustfmt::skip]
        let cases = [
            ("21:00-08:00", Some((21 * 60, 8 * 60))),
            ("08:30-12:00", Some((8 * 60 + 30, 12 * 60))),
            (" 22:15-06:45 ", Some((22 * 60 + 15, 6 * 60 + 45))),
            ("21:00-21:00", None),
            ("24:00-08:00", None),
            ("9:00-17:00", None),
            ("21:00", None),
            ("off", None),
            ("21:60-08:00", None),
        ];
        for (text, want) in cases {
            let got = QuietHours::parse(text).map(|q| (q.start, q.end));
            assert_eq!(got, want, "{text}");
        }
        assert_eq!(
            QuietHours::parse("22:15-06:45").map(|q| q.to_string()),
            Some("22:15-06:45".to_string())
        );
    }

    #[test]
    fn zones_from_numbers() {
        use chrono_tz::America as am;
        #[rustfmt::skip]
        let cases: Vec<(&str, Option<&str>, Vec<Tz>)> = vec![
            ("+12125550100", Some("US"), vec![am::New_York]),
            ("+13105550100", Some("US"), vec![am::Los_Angeles]),
            ("+16045550100", Some("CA"), vec![am::Vancouver]),
            ("+819012345678", Some("JP"), vec![chrono_tz::Asia::Tokyo]),
            ("+447700900123", Some("GB"), vec![chrono_tz::Europe::London]),
            ("+999", None, vec![]),
            ("+2405551234", Some("GQ"), vec![]),
        ];
        for (number, region, want) in cases {
            assert_eq!(zones_for(number, region), want, "{number}");
        }
        // An area code the table does not place: every US zone.
        assert_eq!(zones_for("+15555550100", Some("US")).len(), 7);
        assert!(zones_for("+79161234567", Some("RU")).len() > 5);
    }

    #[test]
    fn when_a_message_may_go() {
        let q = QuietHours::parse("21:00-08:00").expect("window");
        let ny = [chrono_tz::America::New_York];
        let tokyo = [chrono_tz::Asia::Tokyo];
        let au = zones_for("+61412345678", Some("AU"));
        // (zones, at (UTC), release (UTC))
        #[rustfmt::skip]
        let cases: Vec<(&[Tz], OffsetDateTime, OffsetDateTime)> = vec![
            // Tokyo (UTC+9, no DST): 12:00 UTC is 21:00 there, quiet until 08:00 = 23:00 UTC.
            (&tokyo, datetime!(2026-03-01 11:59 UTC), datetime!(2026-03-01 11:59 UTC)),
            (&tokyo, datetime!(2026-03-01 12:00 UTC), datetime!(2026-03-01 23:00 UTC)),
            (&tokyo, datetime!(2026-03-01 22:59 UTC), datetime!(2026-03-01 23:00 UTC)),
            (&tokyo, datetime!(2026-03-01 23:00 UTC), datetime!(2026-03-01 23:00 UTC)),
            // New York in winter (UTC-5): 03:00 local = 08:00 UTC, released at 13:00 UTC.
            (&ny, datetime!(2026-01-15 08:00 UTC), datetime!(2026-01-15 13:00 UTC)),
            (&ny, datetime!(2026-01-15 01:59 UTC), datetime!(2026-01-15 01:59 UTC)),
            (&ny, datetime!(2026-01-15 02:00 UTC), datetime!(2026-01-15 13:00 UTC)),
            // Spring forward (2026-03-08, 02:00 EST -> 03:00 EDT): a night
            // that began in EST ends at 08:00 EDT = 12:00 UTC.
            (&ny, datetime!(2026-03-08 06:30 UTC), datetime!(2026-03-08 12:00 UTC)),
            // ...and the evening of that day starts at 21:00 EDT = 01:00 UTC.
            (&ny, datetime!(2026-03-09 00:59 UTC), datetime!(2026-03-09 00:59 UTC)),
            (&ny, datetime!(2026-03-09 01:00 UTC), datetime!(2026-03-09 12:00 UTC)),
            // Fall back (2026-11-01, 02:00 EDT -> 01:00 EST): the night
            // begun at 21:00 EDT (01:00 UTC) ends at 08:00 EST = 13:00 UTC.
            (&ny, datetime!(2026-11-01 01:00 UTC), datetime!(2026-11-01 13:00 UTC)),
            (&ny, datetime!(2026-11-01 06:30 UTC), datetime!(2026-11-01 13:00 UTC)),
            // Australia, region unknown from a mobile number: quiet if quiet
            // anywhere. 22:00 UTC on 1 March is 09:00 in Sydney (AEDT) but
            // 06:00 in Perth: wait for 08:00 in Perth (00:00 UTC) — by then
            // Sydney is 11:00, Adelaide 10:30, Darwin 09:30, Brisbane 10:00.
            (&au, datetime!(2026-03-01 22:00 UTC), datetime!(2026-03-02 00:00 UTC)),
            // 10:30 UTC: 21:30 in Sydney (quiet) though 18:30 in Perth: the
            // next common waking time is 08:00 Perth.
            (&au, datetime!(2026-03-01 10:30 UTC), datetime!(2026-03-02 00:00 UTC)),
            // 03:00 UTC: 14:00 Sydney, 11:00 Perth: at once.
            (&au, datetime!(2026-03-02 03:00 UTC), datetime!(2026-03-02 03:00 UTC)),
            // No zone known: no quiet hours.
            (&[], datetime!(2026-03-01 03:00 UTC), datetime!(2026-03-01 03:00 UTC)),
        ];
        for (zones, at, want) in cases {
            assert_eq!(release_at(&q, zones, at), want, "{zones:?} at {at}");
        }
        // A window ending inside the spring-forward gap ends with the gap.
        let gap = QuietHours::parse("23:00-02:30").expect("window");
        assert_eq!(
            release_at(&gap, &ny, datetime!(2026-03-08 05:00 UTC)),
            datetime!(2026-03-08 07:00 UTC),
            "02:30 does not exist on that night: 03:00 EDT"
        );
    }
}
