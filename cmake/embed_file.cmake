# Writes file IN into OUT as a C++ raw string literal (the chat page compiled into ds41).
file(READ "${IN}" content)
string(FIND "${content}" ")ds41page\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )ds41page\"")
endif()
file(WRITE "${OUT}.tmp" "R\"ds41page(${content})ds41page\"\n")
file(RENAME "${OUT}.tmp" "${OUT}")
