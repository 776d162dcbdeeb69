"""k auto: what decodes cost (``costs``, from the ``prior`` and the live decodes, cached by
``costcache``; ``calibrate`` when asked), what the rounds taught (``evidence``, kept across
processes by ``recall``), the plan each round (``pacer``, its ``belief`` and the pure
``planner``, priced by ``worth``) and loosening's verdict (``loosening``)."""
