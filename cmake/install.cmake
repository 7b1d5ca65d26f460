# `cmake --install`: the libraries a LibTorch training loop links
# (mutwo_train and what it needs, none of them with gRPC), the public header
# mutwo/scheduled_step.h, and mutwoConfig.cmake for find_package(mutwo)
# (examples/libtorch_train). The worker's command-line library and what it
# adds (gRPC, prometheus-cpp, OpenSSL) are a component of their own,
# `find_package(mutwo COMPONENTS worker)`, found only when asked for.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

install(TARGETS mutwo_train mutwo_worker_runtime mutwo_worker_analysis
                mutwo_model_archive mutwo_common_base mutwo_common_logging
                mutwo_proto_messages
  EXPORT mutwoTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS mutwo_worker mutwo_worker_daemon mutwo_common mutwo_proto
  EXPORT mutwoWorkerTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/mutwo/scheduled_step.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mutwo)
install(EXPORT mutwoTargets NAMESPACE mutwo::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mutwo)
install(EXPORT mutwoWorkerTargets NAMESPACE mutwo::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mutwo)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/mutwoConfig.cmake.in
  ${CMAKE_BINARY_DIR}/mutwoConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mutwo)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/mutwoConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/mutwoConfig.cmake
              ${CMAKE_BINARY_DIR}/mutwoConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mutwo)
