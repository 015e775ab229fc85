"""Collection: one typed `Sample` of this host (sysfs, ethtool ioctl, DCB netlink) or of a
recorded snapshot directory, and the link events that trigger an out-of-cycle probe."""
