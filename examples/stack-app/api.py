# The api tier: GET /hits counts a hit in the store (with the secret's token) and answers "<GREETING> #<count>".
import http.server, os, urllib.request
TOKEN = open(os.path.join(os.environ['SHOAL_SECRETS_DIR'], 'store_token')).read().strip()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        req = urllib.request.Request('http://store:7000/hits', method='POST', headers={'X-Token': TOKEN})
        n = urllib.request.urlopen(req, timeout=3).read().decode()
        body = ('%s #%s' % (os.environ['GREETING'], n)).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
