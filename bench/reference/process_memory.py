"""The process's resident-memory high-water mark, as `sdtrain benchmark` reads its own (Linux /proc)."""


def reset_peak_rss():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_gib():
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kib / 2**20
