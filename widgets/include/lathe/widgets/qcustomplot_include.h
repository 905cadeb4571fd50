#pragma once
// qcustomplot.h spells `signals:` and `foreach`, which QT_NO_KEYWORDS removes. Map them to the
// Q_ macros for the duration of the include only, so nothing else sees the keywords.
#include <QtGlobal>

#ifndef signals
#define signals Q_SIGNALS
#define LATHE_QCP_UNDEF_SIGNALS
#endif
#ifndef foreach
#define foreach Q_FOREACH
#define LATHE_QCP_UNDEF_FOREACH
#endif

#include <qcustomplot.h>

#ifdef LATHE_QCP_UNDEF_SIGNALS
#undef signals
#undef LATHE_QCP_UNDEF_SIGNALS
#endif
#ifdef LATHE_QCP_UNDEF_FOREACH
#undef foreach
#undef LATHE_QCP_UNDEF_FOREACH
#endif
