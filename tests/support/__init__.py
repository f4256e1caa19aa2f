"""What several test folders share, in one place (no tests here).

* ``engine``: containers on every (binding, metadata store) pair (``Env``, the ``env``
  and ``storage`` fixtures), used by the engine, journal and crash tests;
* ``conformance``: ``BindingUnderTest`` and the helpers of the binding conformance suite;
* ``s3server``: the SeaweedFS S3 server the S3 tests start and stop; ``s3``: S3 bindings
  on it, one bucket per test;
* ``webhdfs_server``: the WebHDFS protocol double (no real HDFS can run here); ``hdfs``:
  HDFS bindings on it, or on a real cluster behind ``SLTS_HDFS_URL``.
"""
