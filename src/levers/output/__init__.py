"""What every verb shares to talk to the user: the console (:mod:`console`), the atomic writer
(:mod:`atomic`), error rendering (:mod:`errors`) and the progress line (:mod:`progress`)."""
