/* log.c: the shim's lines on stderr, at the limits file's log level. */
#ifndef VGPU_LOG_H
#define VGPU_LOG_H

#include "limits.h"

extern int vgpu_log_level;
void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define LOGE(...) vgpu_log(VGPU_LOG_ERROR, __VA_ARGS__)
#define LOGW(...) vgpu_log(VGPU_LOG_WARN, __VA_ARGS__)
#define LOGI(...) vgpu_log(VGPU_LOG_INFO, __VA_ARGS__)
#define LOGD(...) vgpu_log(VGPU_LOG_DEBUG, __VA_ARGS__)

#endif
