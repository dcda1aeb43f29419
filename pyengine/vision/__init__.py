"""Vision input: image decoding and preprocessing, projector (mmproj) loading and the
vision towers' graphs."""
