//! The TCP data plane between TaskManagers.
//!
//! - [`protocol`]: frames and messages (Flink's `NettyMessage`).
//! - [`server`]: serves partition requests; the thread that makes a buffer
//!   sendable sends buffers of all requested subpartitions round robin, each
//!   data buffer against one credit of its receiver, events for free.
//! - [`client`]: one connection per remote TaskManager, multiplexing every
//!   [`RemoteInputChannel`](client::RemoteInputChannel) by receiver id; a
//!   channel owns exclusive buffers, borrows floating ones from its gate for
//!   the sender's backlog, and returns credit as the consumer recycles them.
//! - [`environment`]: the [`NetworkEnvironment`](environment::NetworkEnvironment)
//!   of one TaskManager: buffer budget, partition registry, server, client.

pub mod client;
pub mod environment;
#[cfg(feature = "test-harness")]
pub mod peer;
pub mod protocol;
pub mod server;

/// Starts a connection's reader or writer thread.
fn spawn_connection_thread(
    name: String,
    run: impl FnOnce() + Send + 'static,
) -> fluvia_core::Result<()> {
    std::thread::Builder::new()
        .name(name)
        .spawn(run)
        .map(drop)
        .map_err(|e| fluvia_core::FluviaError::io("starting a network thread", e))
}

/// Reads what the socket has into `decoder` (at least `min` bytes of free
/// space). When nothing has arrived, the thread yields and looks again a
/// few times before it blocks in the kernel.
///
/// Why: on a busy connection the next frames are a few microseconds away.
/// A thread blocked in `recv` is woken by the sender's system call, and on
/// a VM with two vCPUs that wake-up (an inter-processor interrupt, an idle
/// vCPU brought back) cost more than the whole buffer's copy; the remote
/// channel moved 0.64–0.70 of raw TCP blocking at once and 0.8–1.0 with
/// these yields.
pub(crate) fn read_socket(
    decoder: &mut protocol::FrameDecoder,
    stream: &std::net::TcpStream,
    min: usize,
) -> std::io::Result<usize> {
    decoder.read_with(min, |buf| {
        let socket = socket2::SockRef::from(stream);
        for _ in 0..crate::cancel::SPINS_BEFORE_BLOCKING {
            // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and `recv`
            // only writes initialised bytes into the slice, so `buf` stays
            // initialised whatever it returns.
            let uninit = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
            match socket.recv_with_flags(uninit, libc::MSG_DONTWAIT) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        std::io::Read::read(&mut &*stream, buf)
    })
}
