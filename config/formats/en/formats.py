"""How the panel writes dates and times in English: ISO-like, and every time with its zone
("2026-11-24 20:15:03 UTC"), so an operator comparing the panel, the logs and kubectl
never has to guess which clock a time is on. Django's own English formats ("Nov. 24, 2026,
8:15 p.m.") say neither the seconds nor the zone."""

DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s T"
DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
