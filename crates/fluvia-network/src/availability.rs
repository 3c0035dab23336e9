//! How a subpartition tells its reader that something became readable: the
//! one callback shared by local channels, the network server's readers and
//! sort-merge views, so none of them depends on the others.

/// Told when a subpartition goes from "nothing to read" to "something to read".
pub trait AvailabilityListener: Send + Sync {
    fn notify_available(&self, channel: usize);
    /// A priority event (an unaligned checkpoint barrier) became readable
    /// on `channel`: it is to be served before channels that only have
    /// data. By default it is an ordinary notification.
    fn notify_priority(&self, channel: usize) {
        self.notify_available(channel);
    }
}
