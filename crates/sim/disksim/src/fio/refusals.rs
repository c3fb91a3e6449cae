//! Why the job reader refuses what it refuses: every refusal names the option, its line and
//! why the simulator cannot model it, in one format, `OPTION=VALUE (line N): WHY`
//! ([`refusal`]). fio's engines that do not do block I/O on a file or a block device
//! ([`engine_why`]), and the fio options that belong to them or to device models this
//! simulator does not have ([`option_why`]).

/// One refusal: `OPTION=VALUE (line N): WHY` (`OPTION (line N): WHY` for a bare option).
pub(crate) fn refusal(k: &str, v: Option<&str>, n: usize, why: &str) -> String {
    match v {
        Some(v) => format!("{k}={v} (line {n}): {why}"),
        None => format!("{k} (line {n}): {why}"),
    }
}

/// Why fio engine `engine` cannot be simulated (None: the reader takes it).
pub(crate) fn engine_why(engine: &str) -> Option<&'static str> {
    let why = match engine {
        "psync" | "sync" | "pvsync" | "pvsync2" | "libaio" | "io_uring" | "null" | "cpuio" => {
            return None
        }
        "net" | "netsplice" | "netio" => {
            "network I/O (TCP/UDP sockets), not block I/O on a device: outside a disk simulator"
        }
        "rdma" | "librpma_apm_client" | "librpma_apm_server" | "librpma_gpspm_client"
        | "librpma_gpspm_server" => {
            "RDMA transfers to a remote host's memory, not block I/O on a device: outside a disk simulator"
        }
        "http" => {
            "HTTP object storage (S3, Swift, WebDAV) over the network, not block I/O on a device: outside a disk simulator"
        }
        "nfs" | "gfapi" | "gfapi_async" | "libhdfs" | "rbd" | "rados" | "dfs" | "libiscsi"
        | "nbd" => {
            "a network storage client (NFS, GlusterFS, HDFS, Ceph, DAOS, iSCSI or NBD): the server and the network are not modelled, only a local device"
        }
        "ime_psync" | "ime_psyncv" | "ime_aio" => {
            "DDN's IME burst-buffer client library: its servers are not modelled"
        }
        "pmemblk" | "dev-dax" | "libpmem" => {
            "persistent memory written with CPU loads and stores, not requests through the block layer: no such device model"
        }
        "libcufile" => "GPU memory transfers (NVIDIA cuFile): no GPU model",
        "exec" => "runs another program: what it does is that program's, not fio's I/O",
        "filecreate" | "filestat" | "filedelete" | "falloc" | "ftruncate" => {
            "file-system calls (create, stat, unlink, fallocate, ftruncate) that do no data I/O: the simulator has no file-system metadata model"
        }
        "e4defrag" => {
            "ext4's EXT4_IOC_MOVE_EXT ioctl: moving a file's extents needs ext4's allocator, not modelled"
        }
        "sg" => {
            "SCSI commands through /dev/sg (SG_IO: WRITE SAME, VERIFY...): the SCSI command set below the block layer is not modelled"
        }
        "io_uring_cmd" | "xnvme" | "spdk" => {
            "NVMe commands that bypass the kernel's block layer (passthrough or a user-space driver): not modelled"
        }
        "libzbc" => "zoned SCSI/ATA commands (libzbc): no zoned device model",
        "mtd" => "raw flash (MTD: erase blocks, bad blocks), not a block device: no flash-chip model",
        "cpp_null" => {
            "an external engine loaded from a shared object (fio's C++ example): what it does is its code's"
        }
        "mmap" | "splice" | "posixaio" | "vsync" | "sync_file_range" => {
            "a file engine whose own kernel path (page faults, pipes, POSIX AIO threads, sync_file_range) is not modelled"
        }
        _ => return Some(OUTSIDE_UNKNOWN),
    };
    Some(why)
}

const OUTSIDE_UNKNOWN: &str =
    "not an engine this simulator models (psync, sync, pvsync, pvsync2, libaio, io_uring, null, cpuio)";

/// Why a fio option the reader does not take cannot be modelled, when it is one of fio's (its
/// engines' or its device models'); None: not an option the reader knows of.
pub(crate) fn option_why(k: &str) -> Option<&'static str> {
    let why = match k {
        "hostname" | "port" | "protocol" | "listen" | "ttl" | "pingpong" | "interface"
        | "verb" | "bindname" | "serverip" | "window_size" | "mss" | "nodelay" => {
            "an option of fio's network and RDMA engines: outside a disk simulator"
        }
        "mem" | "gpu_dev_id" | "direct_write_to_pmem" | "busy_wait_polling" => {
            "an option of fio's RDMA and GPU engines: no such model"
        }
        "clientname" | "pool" | "conf" | "busy_poll" | "rbdname" | "volume" | "brick"
        | "namenode" | "hdfsdirectory" | "chunk_size" | "uri" | "cont" | "http_host"
        | "http_user" | "http_pass" | "http_mode" | "https" | "http_verbose"
        | "http_s3_key" | "http_s3_keyid" | "http_s3_region" | "http_swift_auth_token" => {
            "an option of fio's network storage engines: the server and network are not modelled"
        }
        "program" | "arguments" | "grace_time" | "std_redirect" => {
            "an option of fio's exec engine: it runs another program"
        }
        "donorname" | "inplace" => "an option of fio's e4defrag engine: ext4's allocator is not modelled",
        "sg_write_mode" | "hipri_percentage" | "readfua" | "writefua" => {
            "an option of fio's SCSI generic engine: the SCSI command set is not modelled"
        }
        "cmd_type" => "an option of fio's io_uring_cmd engine (NVMe passthrough): not modelled",
        "skip_bad" => "an option of fio's MTD engine: no flash-chip model",
        "max_open_zones" | "zonecapacity" | "zone_reset_threshold"
        | "zone_reset_frequency" | "job_max_open_zones" | "ignore_zone_limits" => {
            "an option of zonemode=zbd for writers (open-zone limits, zone capacity and resets of fio's emulated zones): not modelled"
        }
        "block_error_percentiles" => "reports trim errors by block (MTD's bad blocks): no error model",
        "verify_backlog" | "verify_backlog_batch" => {
            "fio's read-back interleaved with the writes every N blocks: only the read-back after all writes is modelled"
        }
        _ => return None,
    };
    Some(why)
}
