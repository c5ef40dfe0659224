"""Each round's shape chosen from what it costs and what it is likely to keep: the machine's
measured costs (`costs`), acceptance estimated as the session goes (`acceptance`), the planner that
weighs them (`autotune`), the plan it makes (`round_shape`) and its account of a session
(`description`)."""
