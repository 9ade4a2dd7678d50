//! Which GPUs this machine offers, what each one guarantees, and which one mgn would use.
//!
//! Devices come from blade (the same view the backend will run through, with its reasons for
//! rejecting a device); on Vulkan their limits are read from the driver with ash, because the
//! kernels must be sized by the real numbers — or by the guaranteed floor under `MGN_MIN_SPEC=1`.

use crate::limits::DeviceLimits;

#[derive(Clone, Debug)]
pub struct Device {
    /// The driver's device ID (what `MGN_DEVICE` may name, besides a part of the name).
    pub id: u32,
    pub name: String,
    pub driver: String,
    /// A CPU implementation such as lavapipe (llvmpipe).
    pub software: bool,
    /// Why the device cannot be used, if it cannot.
    pub rejected: Option<String>,
    /// The limits the driver reports (before `MGN_MIN_SPEC`).
    pub limits: Option<DeviceLimits>,
    pub float16: bool,
    /// Cooperative-matrix tile sizes (f32 inputs, f16 inputs), 0 when unsupported.
    pub cooperative_matrix: (u32, u32),
    /// Bytes of the largest device-local memory heap (where the arena lives), when known.
    pub memory: Option<u64>,
}

/// Every device, or one sentence saying why there is none to list. Listed once per process:
/// each listing loads the Vulkan driver and creates an instance, and NVIDIA's driver stops
/// creating instances after it has been loaded and unloaded a few times in one process.
pub fn devices() -> Result<Vec<Device>, String> {
    static LISTED: std::sync::OnceLock<Result<Vec<Device>, String>> = std::sync::OnceLock::new();
    LISTED.get_or_init(list_devices).clone()
}

/// Starts `devices`' one listing on a thread of its own and returns at once. The listing loads
/// the driver and creates an instance: 40 ms on lavapipe, 160 ms on an H200's host, which a
/// command that compiles its model before it opens a session (`mgnc bench --backend vulkan`)
/// spends compiling instead. The session's `devices()` then waits for this listing, if it is
/// not done yet, instead of starting its own. A process that started one calls
/// `finish_listing` before it exits.
pub fn list_in_background() {
    in_background(|| drop(devices()));
}

/// Runs `list` on a thread of its own that `finish_listing` waits for.
fn in_background(list: impl FnOnce() + Send + 'static) {
    let (done, listed) = std::sync::mpsc::sync_channel(1);
    let listing = std::thread::Builder::new().name("mgn-devices".into());
    let spawned = listing.spawn(move || {
        list();
        let _ = done.send(());
    });
    // A thread that cannot start leaves the listing to the first `devices()`, as before.
    if let (Ok(_), Ok(mut slot)) = (spawned, LISTING.lock()) {
        *slot = Some(listed);
    }
}

/// Waits for a listing `list_in_background` started, if any, for at most `LISTING_PATIENCE`: a
/// process that exits while another thread is inside the driver's instance creation runs the
/// driver's exit handlers under it (a command that fails before it needs the device must not
/// crash on its way out), and one whose driver never answers still exits.
pub fn finish_listing() {
    let listed = LISTING.lock().ok().and_then(|mut slot| slot.take());
    if let Some(listed) = listed {
        let _ = listed.recv_timeout(LISTING_PATIENCE);
    }
}

const LISTING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

static LISTING: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>> =
    std::sync::Mutex::new(None);

fn list_devices() -> Result<Vec<Device>, String> {
    let reports = std::panic::catch_unwind(blade_graphics::Context::enumerate)
        .map_err(|_| "the graphics driver crashed while listing devices".to_string())?
        .map_err(|e| match e {
            blade_graphics::NotSupportedError::Platform(p) => platform_reason(&format!("{p:?}")),
            blade_graphics::NotSupportedError::NoSupportedDeviceFound => {
                "the driver lists no device that supports compute".to_string()
            }
            blade_graphics::NotSupportedError::PlatformNotSupported => {
                "this platform has neither Vulkan nor Metal".to_string()
            }
        })?;
    let limits = vulkan_limits();
    let out: Vec<Device> = reports
        .into_iter()
        .map(|r| {
            let reported = limits.iter().find(|(id, ..)| *id == r.device_id);
            let (rejected, float16, coop) = match &r.status {
                blade_graphics::DeviceReportStatus::Available { caps, .. } => (
                    (!caps.compute).then(|| "it does not support compute shaders".to_string()),
                    caps.shader_float16,
                    (caps.cooperative_matrix.f32_tile, caps.cooperative_matrix.f16_tile),
                ),
                blade_graphics::DeviceReportStatus::Rejected(why) => {
                    (Some(why.clone()), false, (0, 0))
                }
            };
            Device {
                id: r.device_id,
                name: r.information.device_name.clone(),
                driver: r.information.driver_name.clone(),
                software: r.information.is_software_emulated,
                rejected,
                limits: reported.map(|(_, l, _)| DeviceLimits { coop_f16_tile: coop.1, ..*l }),
                memory: reported.and_then(|(.., m)| *m),
                float16,
                cooperative_matrix: coop,
            }
        })
        .collect();
    if out.is_empty() {
        return Err("the Vulkan driver lists no devices".to_string());
    }
    Ok(out)
}

/// One sentence for a driver that could not be started.
fn platform_reason(detail: &str) -> String {
    if detail.contains("INCOMPATIBLE_DRIVER") {
        "no Vulkan driver is installed (the Vulkan loader found no compatible driver; for a \
         software one: apt-get install mesa-vulkan-drivers)"
            .to_string()
    } else if detail.to_lowercase().contains("load") || detail.contains("libvulkan") {
        "the Vulkan loader is not installed (libvulkan.so.1; apt-get install libvulkan1)"
            .to_string()
    } else if detail.contains("INITIALIZATION_FAILED") {
        "the Vulkan driver failed to initialize".to_string()
    } else {
        format!("no usable Vulkan or Metal driver was found ({detail})")
    }
}

/// The device mgn uses: `MGN_DEVICE` (an ID or part of a name) if set, else the first usable
/// hardware GPU, else a usable software one. `Err` says why none can be used.
pub fn choose(devices: &[Device]) -> Result<&Device, String> {
    let usable = || devices.iter().filter(|d| d.rejected.is_none());
    if let Ok(want) = std::env::var("MGN_DEVICE") {
        let want_lower = want.to_lowercase();
        let found = devices
            .iter()
            .find(|d| d.id.to_string() == want || d.name.to_lowercase().contains(&want_lower));
        return match found {
            Some(d) if d.rejected.is_none() => Ok(d),
            Some(d) => Err(format!(
                "MGN_DEVICE={want} names {}, which cannot be used: {}",
                d.name,
                d.rejected.as_deref().unwrap_or("unknown reason")
            )),
            None => Err(format!("MGN_DEVICE={want} matches no device")),
        };
    }
    usable().find(|d| !d.software).or_else(|| usable().next()).ok_or_else(|| {
        match devices.iter().find_map(|d| d.rejected.clone()) {
            Some(why) => format!("no device can be used: {why}"),
            None => "no device can be used".to_string(),
        }
    })
}

/// Per device ID: its limits and the size of its largest device-local heap.
type Reported = Vec<(u32, DeviceLimits, Option<u64>)>;

#[cfg(not(any(target_os = "macos", target_os = "ios")))]
fn vulkan_limits() -> Reported {
    use ash::vk;
    // Any failure here only means the limits are not shown; `devices` already reported why
    // the driver is unusable if it is.
    // The loader stays loaded for the life of the process (see `devices`).
    static ENTRY: std::sync::OnceLock<Option<ash::Entry>> = std::sync::OnceLock::new();
    let Some(entry) = ENTRY.get_or_init(|| unsafe { ash::Entry::load() }.ok()) else {
        return Vec::new();
    };
    // 1.3: the subgroup size control properties below are core there.
    let app = vk::ApplicationInfo::default().api_version(vk::make_api_version(0, 1, 3, 0));
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    let Ok(instance) = (unsafe { entry.create_instance(&info, None) }) else { return Vec::new() };
    let mut out = Vec::new();
    if let Ok(devices) = unsafe { instance.enumerate_physical_devices() } {
        for pd in devices {
            let p = unsafe { instance.get_physical_device_properties(pd) };
            let l = p.limits;
            let m = unsafe { instance.get_physical_device_memory_properties(pd) };
            let heaps = &m.memory_heaps[..m.memory_heap_count as usize];
            let local =
                heaps.iter().filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL));
            let memory = local.map(|h| h.size).max();
            let subgroup_size = fixed_subgroup_size(&instance, pd, p.api_version);
            out.push((
                p.device_id,
                DeviceLimits {
                    max_workgroups: l.max_compute_work_group_count,
                    max_invocations: l.max_compute_work_group_invocations,
                    max_shared_memory: l.max_compute_shared_memory_size,
                    max_storage_buffer_range: l.max_storage_buffer_range as u64,
                    max_storage_buffers: l.max_per_stage_descriptor_storage_buffers,
                    max_parameter_block: l.max_push_constants_size,
                    // From blade's report (`list_devices`), which opens the device with it.
                    coop_f16_tile: 0,
                    subgroup_size,
                },
                memory,
            ));
        }
    }
    // Deliberately never destroyed (this runs once per process; ash's `Instance` is a plain
    // handle, so leaving scope without `destroy_instance` keeps it): while one instance lives,
    // the loader keeps the driver's library loaded, so sessions opening and closing their own
    // instances do not unload and reload it each time — NVIDIA's driver failed to create
    // instances after a few such cycles in one process.
    let _kept_alive = instance;
    out
}

/// The size of every compute subgroup of `pd`, when the driver fixes it: Vulkan 1.3 reports
/// the least and greatest size a pipeline may get, and a device where they differ (or one older
/// than 1.3, which does not say) counts as varying (0).
#[cfg(not(any(target_os = "macos", target_os = "ios")))]
fn fixed_subgroup_size(instance: &ash::Instance, pd: ash::vk::PhysicalDevice, api: u32) -> u32 {
    use ash::vk;
    if vk::api_version_major(api) == 1 && vk::api_version_minor(api) < 3 {
        return 0;
    }
    let mut basic = vk::PhysicalDeviceSubgroupProperties::default();
    let mut control = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
    let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut basic);
    props = props.push_next(&mut control);
    unsafe { instance.get_physical_device_properties2(pd, &mut props) };
    let (min, max) = (control.min_subgroup_size, control.max_subgroup_size);
    if min == max && min == basic.subgroup_size {
        min
    } else {
        0
    }
}

#[cfg(any(target_os = "macos", target_os = "ios"))]
fn vulkan_limits() -> Reported {
    // Metal's limits are not read yet (untested here: no Apple machine); the floor applies.
    Vec::new()
}

#[cfg(test)]
mod tests {
    /// `finish_listing` returns once the background job is done (here a slow one), and at
    /// once when none was started.
    #[test]
    fn finishing_waits_for_the_background_listing() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static DONE: AtomicBool = AtomicBool::new(false);
        super::in_background(|| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            DONE.store(true, Ordering::SeqCst);
        });
        assert!(!DONE.load(Ordering::SeqCst), "the job runs in the background");
        super::finish_listing();
        assert!(DONE.load(Ordering::SeqCst), "finish_listing waited for it");
        let start = std::time::Instant::now();
        super::finish_listing();
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
    }

    use super::*;

    fn dev(id: u32, name: &str, software: bool, rejected: Option<&str>) -> Device {
        Device {
            id,
            name: name.into(),
            driver: String::new(),
            software,
            rejected: rejected.map(String::from),
            limits: None,
            float16: false,
            cooperative_matrix: (0, 0),
            memory: None,
        }
    }

    #[test]
    fn hardware_is_preferred_over_software() {
        let ds = [dev(1, "llvmpipe", true, None), dev(2, "NVIDIA H200", false, None)];
        assert_eq!(choose(&ds).map(|d| d.id), Ok(2));
        let ds = [
            dev(1, "llvmpipe", true, None),
            dev(2, "Old GPU", false, Some("Vulkan 1.0 is too old")),
        ];
        assert_eq!(choose(&ds).map(|d| d.id), Ok(1));
        let ds = [dev(2, "Old GPU", false, Some("Vulkan 1.0 is too old"))];
        assert_eq!(
            choose(&ds).map(|d| d.id),
            Err("no device can be used: Vulkan 1.0 is too old".into())
        );
    }
}
