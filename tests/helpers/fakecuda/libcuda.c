/* A stand-in for the NVIDIA driver's libcuda.so.1 with only the calls mg's
 * GPU probe makes (runtime/gpu_plugin.c), so that the probe's answers for a
 * machine with a driver but no device, or with devices, can be checked on a
 * machine with no driver (tests/integration/cuda_probe.t puts this directory
 * on LD_LIBRARY_PATH). It answers from the environment:
 *   FAKECUDA_INIT     what cuInit returns (default 0; 100 = CUDA_ERROR_NO_DEVICE)
 *   FAKECUDA_DEVICES  how many devices there are (default 0)
 *   FAKECUDA_DRIVER   the CUDA version the driver supports (default 13000)
 * Nothing else of the driver API is here: the CUDA runtime cannot run on it. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuInit(unsigned flags);
int cuDriverGetVersion(int *version);
int cuDeviceGetCount(int *count);
int cuDeviceGet(int *dev, int ordinal);
int cuDeviceGetName(char *name, int len, int dev);
int cuDeviceTotalMem_v2(size_t *bytes, int dev);
int cuDeviceGetAttribute(int *value, int attrib, int dev);
int cuGetErrorName(int err, const char **name);
int cuGetErrorString(int err, const char **text);

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

int cuInit(unsigned flags)
{
    (void)flags;
    return env_int("FAKECUDA_INIT", 0);
}

int cuDriverGetVersion(int *version)
{
    *version = env_int("FAKECUDA_DRIVER", 13000);
    return 0;
}

int cuDeviceGetCount(int *count)
{
    *count = env_int("FAKECUDA_DEVICES", 0);
    return 0;
}

int cuDeviceGet(int *dev, int ordinal)
{
    if (ordinal < 0 || ordinal >= env_int("FAKECUDA_DEVICES", 0))
        return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}

int cuDeviceGetName(char *name, int len, int dev)
{
    snprintf(name, (size_t)len, "Fake GPU %d", dev);
    return 0;
}

int cuDeviceTotalMem_v2(size_t *bytes, int dev)
{
    *bytes = (size_t)(16 + dev) << 30;
    return 0;
}

int cuDeviceGetAttribute(int *value, int attrib, int dev)
{
    (void)dev;
    /* 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR */
    *value = attrib == 75 ? 9 : attrib == 76 ? 0 : 0;
    return 0;
}

int cuGetErrorName(int err, const char **name)
{
    *name = err == 100   ? "CUDA_ERROR_NO_DEVICE"
            : err == 999 ? "CUDA_ERROR_UNKNOWN"
                         : "CUDA_ERROR_?";
    return 0;
}

int cuGetErrorString(int err, const char **text)
{
    *text = err == 100 ? "no CUDA-capable device is detected" : "unknown error";
    return 0;
}
