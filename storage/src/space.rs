//! The free-space floor (Kafka-style `log.dir.min.free.bytes`) that the logs' reservations keep on their
//! filesystem.
//!
//! A log writes its data only into blocks its active segment reserved ahead (see `log::durability`), so
//! the reservations are where a disk fills, up to 32 MiB at a time per partition. Before each one, the
//! log asks the floor for room: the floor measures the free space (through [`crate::fs::Fs`]) and takes
//! off the floor itself and what it granted to reservations still under way (their fallocate has not
//! returned, so the measure may not show them yet). The grant is handed back when the reservation is
//! done, by which time the measure shows it. One floor is shared by every log on the filesystem, on every
//! shard (thread), so concurrent reservations never count the same free bytes twice.
//!
//! Near the floor a reservation gets less than it asks for: what the batch needs, and at most half of the
//! room beyond that, so the partitions that write share the last of the room rather than the first one
//! taking all of it. When even the batch does not fit above the floor, the append is refused, and the
//! floor says it is [`SpaceFloor::refusing`] until a measure finds room for that batch again (space freed):
//! the owner then refuses every append, not only those of partitions whose reservations ran out, and tells
//! the operator once. Small files (index entries, checkpoints, the leader-epoch file) are written without
//! reservations: the room below the floor is for them.

use std::io;
use std::sync::{Arc, Mutex};

/// The free bytes reservations must leave on one filesystem. Shared (`Arc`) by the logs on it.
#[derive(Debug)]
pub struct SpaceFloor {
    floor_bytes: u64,
    room: Mutex<Room>,
}

#[derive(Debug, Default)]
struct Room {
    /// Bytes granted to reservations under way.
    granted: u64,
    /// The most a refused reservation needed, until the room above the floor has that much again (0: none
    /// refused).
    refused: u64,
}

/// Room granted to one reservation; handed back when dropped (once the reservation is done).
#[derive(Debug)]
#[must_use = "the room is handed back when the grant is dropped"]
pub struct Grant {
    floor: Arc<SpaceFloor>,
    bytes: u64,
}

impl Grant {
    /// The bytes the reservation may take.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.floor.room().granted -= self.bytes;
    }
}

impl SpaceFloor {
    pub fn new(floor_bytes: u64) -> Arc<SpaceFloor> {
        Arc::new(SpaceFloor { floor_bytes, room: Mutex::default() })
    }

    pub fn floor_bytes(&self) -> u64 {
        self.floor_bytes
    }

    fn room(&self) -> std::sync::MutexGuard<'_, Room> {
        // Every update leaves the counts whole: one that panicked in between cannot have happened.
        self.room.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a reservation was refused at the floor and the free space has not been found to hold it
    /// since (see [`SpaceFloor::measured`]).
    pub fn refusing(&self) -> bool {
        self.room().refused > 0
    }

    /// The free space as measured now: once the room above the floor holds the reservation refused last,
    /// the floor no longer says it is refusing.
    pub fn measured(&self, free: u64) {
        let mut room = self.room();
        if free.saturating_sub(self.floor_bytes).saturating_sub(room.granted) >= room.refused {
            room.refused = 0;
        }
    }

    /// Room for a reservation that needs `need` bytes and would like `want` (at least `need`): `need`
    /// plus at most half of the room above the floor beyond it, up to `want`. `free` measures the free
    /// bytes now; it is called with the grants held still, so a reservation that finishes meanwhile is
    /// counted once, either as granted or as measured. `Err` with the free bytes measured when `need`
    /// does not fit above the floor. A measure that fails grants `want`: the reservation then meets a
    /// full disk itself, as a refusal.
    pub fn grant(self: &Arc<Self>, need: u64, want: u64, free: impl FnOnce() -> io::Result<u64>) -> Result<Grant, u64> {
        assert!(need <= want, "a reservation wants at least what it needs ({need} > {want})");
        let mut room = self.room();
        let bytes = match free() {
            Ok(free) => {
                let above = free.saturating_sub(self.floor_bytes).saturating_sub(room.granted);
                if above < need {
                    room.refused = room.refused.max(need);
                    return Err(free);
                }
                need + (want - need).min((above - need) / 2)
            }
            Err(e) => {
                tracing::debug!(error = %e, "free space not measured; the reservation goes ahead");
                want
            }
        };
        room.granted += bytes;
        Ok(Grant { floor: self.clone(), bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn grants_leave_the_floor_free_and_shrink_near_it() {
        let floor = SpaceFloor::new(32 * MIB);
        // Far from the floor: all that is wanted.
        assert_eq!(floor.grant(MIB, 32 * MIB, || Ok(1024 * MIB)).unwrap().bytes(), 32 * MIB);
        // Near it: the need and half the room beyond.
        assert_eq!(floor.grant(MIB, 32 * MIB, || Ok(43 * MIB)).unwrap().bytes(), 6 * MIB);
        // At it: refused with what was measured.
        assert_eq!(floor.grant(MIB, 32 * MIB, || Ok(32 * MIB + MIB - 1)).unwrap_err(), 33 * MIB - 1);
        assert_eq!(floor.room().granted, 0, "every grant was handed back");
    }

    #[test]
    fn a_refusal_lasts_until_a_measure_finds_room_for_the_refused_reservation() {
        let floor = SpaceFloor::new(32 * MIB);
        assert!(!floor.refusing());
        assert!(floor.grant(2 * MIB, 2 * MIB, || Ok(33 * MIB)).is_err());
        assert!(floor.refusing());
        floor.measured(33 * MIB);
        assert!(floor.refusing(), "no room for it yet");
        floor.measured(34 * MIB);
        assert!(!floor.refusing(), "space was freed");
    }

    #[test]
    fn grants_under_way_count_against_the_floor_until_handed_back() {
        let floor = SpaceFloor::new(10 * MIB);
        let first = floor.grant(8 * MIB, 8 * MIB, || Ok(20 * MIB)).unwrap();
        // The measure does not show the first yet: 10 MiB above the floor, 8 of them granted.
        assert_eq!(floor.grant(4 * MIB, 4 * MIB, || Ok(20 * MIB)).unwrap_err(), 20 * MIB);
        let second = floor.grant(2 * MIB, 4 * MIB, || Ok(20 * MIB)).unwrap();
        assert_eq!(second.bytes(), 2 * MIB);
        drop((first, second));
        // Done: the measure shows them now, and only the measure counts them.
        assert_eq!(floor.grant(MIB, MIB, || Ok(11 * MIB)).unwrap().bytes(), MIB);
    }
}
